/**
 * Sealing a randomized payload to the analyzer's public key (shuffle model,
 * docs/shuffle.md; the Python SDK's client/sealed.py, byte for byte, checked against
 * conformance/v1/sealed.json). The plaintext is a `Report` holding only its payload,
 * encoded, framed by a 4-byte big-endian length and zero-padded to a multiple of 256
 * bytes (so a ciphertext's length reveals only how many 256-byte blocks the payload
 * fills); HPKE's `info` binds the policy (id, version, digest); the wire carries
 * `Report.sealed` (ciphertext, key id). The HPKE code (hpke.ts, @hpke/*) is imported on
 * the first seal only.
 */
import { create, toBinary } from "@bufbuild/protobuf";
import { ReportSchema } from "./gen/fedldp/v1/collector_pb.js";
import type { Output } from "./mechanisms.js";
import { hex } from "./policy.js";
import { sha256Sync } from "./sha256.js";
import { type ReportHeader, payloadOf } from "./wire.js";

const INFO_DOMAIN = new TextEncoder().encode("fedldp.sealed.v2\u0000");
/** The padded plaintext's length is a multiple of this (client/sealed.py PAD_BUCKET). */
export const PAD_BUCKET = 256;
/** HPKE's 32-byte encapsulated key plus the 16-byte ChaCha20-Poly1305 tag. */
const OVERHEAD = 32 + 16;
/** The largest sealed ciphertext (enc + 255 padded blocks + tag). */
export const MAX_CIPHERTEXT_BYTES = OVERHEAD + 255 * PAD_BUCKET;

/** The id of an analyzer public key: the first 8 bytes of its SHA-256, hex. */
export function sealKeyId(publicKey: Uint8Array): string {
  if (publicKey.length !== 32) throw new RangeError("an X25519 public key is 32 bytes");
  return hex(sha256Sync(publicKey).subarray(0, 8));
}

/** HPKE `info`: the domain, then policy id (u32 LE length, UTF-8), version (u64 LE), digest (u32 LE length, bytes). */
export function sealInfo(policyId: string, policyVersion: bigint, policyDigest: Uint8Array): Uint8Array {
  const id = new TextEncoder().encode(policyId);
  const out = new Uint8Array(INFO_DOMAIN.length + 4 + id.length + 8 + 4 + policyDigest.length);
  const view = new DataView(out.buffer);
  let at = 0;
  out.set(INFO_DOMAIN, at); at += INFO_DOMAIN.length;
  view.setUint32(at, id.length, true); at += 4;
  out.set(id, at); at += id.length;
  view.setBigUint64(at, policyVersion, true); at += 8;
  view.setUint32(at, policyDigest.length, true); at += 4;
  out.set(policyDigest, at);
  return out;
}

/** The sealed plaintext of an encoded payload: 4-byte big-endian length, the payload, zeros to a multiple of 256. */
export function padPayload(encoded: Uint8Array): Uint8Array {
  const framed = 4 + encoded.length;
  if (framed > MAX_CIPHERTEXT_BYTES - OVERHEAD) throw new RangeError("the encoded payload is too large to seal");
  const out = new Uint8Array(framed + ((PAD_BUCKET - (framed % PAD_BUCKET)) % PAD_BUCKET));
  new DataView(out.buffer).setUint32(0, encoded.length);
  out.set(encoded, 4);
  return out;
}

/** The encoded payload-only Report of a report's payload oneof (what is sealed). */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export function payloadOnlyBytes(payload: any): Uint8Array {
  return toBinary(ReportSchema, create(ReportSchema, { payload }));
}

/**
 * `Report.sealed` of a payload oneof: sealed to `publicKey` for the policy (id, version,
 * digest). `ikmE` (conformance vectors only) fixes HPKE's ephemeral key.
 */
export async function sealPayload(
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  payload: any, publicKey: Uint8Array, info: Uint8Array, ikmE?: Uint8Array,
): Promise<{ ciphertext: Uint8Array; keyId: string }> {
  const { hpkeSeal } = await import("./hpke.js");
  const ciphertext = await hpkeSeal(publicKey, info, padPayload(payloadOnlyBytes(payload)), ikmE);
  return { ciphertext, keyId: sealKeyId(publicKey) };
}

/**
 * Serialized Report bytes of `output` under `header` with the payload sealed to the
 * analyzer's `publicKey` for the header's policy: what the outbox stores under a
 * shuffle-model policy (client/sealed.py seal_report).
 */
export async function sealedReportBytes(header: ReportHeader, output: Output, publicKey: Uint8Array, ikmE?: Uint8Array): Promise<Uint8Array> {
  const info = sealInfo(header.policyId, header.policyVersion, header.policyDigest);
  const sealed = await sealPayload(payloadOf(output), publicKey, info, ikmE);
  return toBinary(ReportSchema, create(ReportSchema, { ...header, payload: { case: "sealed", value: sealed } }));
}
