/**
 * Sealing a randomized payload to the analyzer's public key (shuffle model,
 * docs/shuffle.md; the Python SDK's client/sealed.py, byte for byte, checked against
 * conformance/v1/sealed.json). The plaintext is a `Report` holding only its payload,
 * encoded (wire.ts builds it), framed by a 4-byte big-endian length and zero-padded to a
 * multiple of 256 bytes (so a ciphertext's length reveals only how many 256-byte blocks
 * the payload fills); HPKE's `info` binds the policy (id, version, digest); the wire
 * carries `Report.sealed` (ciphertext, key id).
 *
 * This module and hpke.ts (@hpke/*) are imported on the first seal only (wire.ts
 * `sealedReportBytes`) and import nothing else of the SDK, so they form one lazy chunk of
 * the browser bundles that a page without shuffle-model policies never loads.
 */
import { hpkeSeal } from "./hpke.js";

const INFO_DOMAIN = new TextEncoder().encode("fedldp.sealed.v2\u0000");
/** The padded plaintext's length is a multiple of this (client/sealed.py PAD_BUCKET). */
export const PAD_BUCKET = 256;
/** HPKE's 32-byte encapsulated key plus the 16-byte ChaCha20-Poly1305 tag. */
const OVERHEAD = 32 + 16;
/** The largest sealed ciphertext (enc + 255 padded blocks + tag). */
export const MAX_CIPHERTEXT_BYTES = OVERHEAD + 255 * PAD_BUCKET;

/** The id of an analyzer public key: the first 8 bytes of its SHA-256, hex. */
export async function sealKeyId(publicKey: Uint8Array): Promise<string> {
  if (publicKey.length !== 32) throw new RangeError("an X25519 public key is 32 bytes");
  const digest = new Uint8Array(await globalThis.crypto.subtle.digest("SHA-256", publicKey.slice()));
  return Array.from(digest.subarray(0, 8), (b) => b.toString(16).padStart(2, "0")).join("");
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

/**
 * `Report.sealed` (ciphertext, key id) of an encoded payload-only Report, sealed to the
 * analyzer's raw X25519 `publicKey` for the policy (id, version, digest). The ephemeral key
 * comes from the platform CSPRNG; `ikmE` (conformance vectors only) derives it instead.
 */
export async function sealPayload(
  payloadOnly: Uint8Array, publicKey: Uint8Array, policyId: string, policyVersion: bigint, policyDigest: Uint8Array,
  ikmE?: Uint8Array,
): Promise<{ ciphertext: Uint8Array; keyId: string }> {
  const info = sealInfo(policyId, policyVersion, policyDigest);
  const ciphertext = await hpkeSeal(publicKey, info, padPayload(payloadOnly), ikmE);
  return { ciphertext, keyId: await sealKeyId(publicKey) };
}
