/**
 * Reports on the wire (collector.proto): the payload of a mechanism output, report
 * ids (client/report_ids.py's layout: an 8-byte random run prefix, then a big-endian
 * 64-bit counter from a random start, runs of 256), and SubmitRequest bytes.
 */
import { create, toBinary } from "@bufbuild/protobuf";
import { type Report, ReportSchema, SubmitRequestSchema } from "./gen/fedldp/v1/collector_pb.js";
import type { Output } from "./mechanisms.js";
import { type RandomSource, systemRandom } from "./random.js";

export const REPORT_ID_BYTES = 16;
export const RUN_LENGTH = 256;
const COARSE_SECONDS = 3600n;

/** Report ids: unique, unpredictable, consecutive ids of one device adjacent. */
export class ReportIds {
  private prefix = new Uint8Array(8);
  private start = 0n;
  private used: number;
  constructor(private readonly rng: RandomSource = systemRandom, private readonly runLength = RUN_LENGTH) {
    this.used = runLength;
  }
  next(): Uint8Array {
    if (this.used >= this.runLength) {
      const words = new Uint32Array(4);
      this.rng.fill(words);
      const view = new DataView(this.prefix.buffer);
      view.setUint32(0, words[0] as number);
      view.setUint32(4, words[1] as number);
      this.start = (BigInt(words[2] as number) << 32n) | BigInt(words[3] as number);
      this.used = 0;
    }
    const counter = (this.start + BigInt(this.used)) % (1n << 64n);
    this.used += 1;
    const id = new Uint8Array(REPORT_ID_BYTES);
    id.set(this.prefix, 0);
    new DataView(id.buffer).setBigUint64(8, counter);
    return id;
  }
}

/** The fields of a report other than its payload. */
export interface ReportHeader {
  reportId: Uint8Array;
  policyId: string;
  policyVersion: bigint;
  policyDigest: Uint8Array;
  coarseTime: bigint;
}

/** `now` (Unix seconds) truncated to the hour. */
export function coarseTime(nowSeconds: bigint): bigint {
  return nowSeconds - (nowSeconds % COARSE_SECONDS);
}

/** The payload oneof (Report and AttributePayload share its cases) of an output. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
function payloadOf(output: Output): any {
  switch (output.kind) {
    case "category": return { case: "category", value: { index: output.index } };
    case "bits": return { case: "bits", value: { bits: output.bits, length: output.length } };
    case "hashed": return { case: "hashed", value: { seed: output.seed, value: output.value } };
    case "numeric": return { case: "numeric", value: { value: output.value } };
    case "index_bits": return { case: "indexBits", value: { indices: output.indices, bits: output.bits } };
    case "sketch_row": return { case: "sketchRow", value: { row: output.row, bits: output.bits, length: output.length } };
    case "sketch_bit": return { case: "sketchBit", value: { row: output.row, column: output.column, bit: output.bit } };
    case "group_hashed": return { case: "groupHashed", value: { group: output.group, key: output.key, value: output.value } };
    default: return {
      case: "multi",
      value: { parts: output.parts.map((p) => ({ attribute: p.attribute, payload: payloadOf(p.output) })) },
    };
  }
}

/** The wire Report of `output` under `header`. */
export function makeReport(header: ReportHeader, output: Output): Report {
  return create(ReportSchema, { ...header, payload: payloadOf(output) });
}

/** The encoded Report holding only `output`'s payload (what a shuffle-model report seals). */
export function payloadOnlyBytes(output: Output): Uint8Array {
  return toBinary(ReportSchema, create(ReportSchema, { payload: payloadOf(output) }));
}

/**
 * Serialized Report bytes of `output` under `header` with the payload sealed to the
 * analyzer's `publicKey` for the header's policy (client/sealed.py seal_report): what the
 * outbox stores under a shuffle-model policy. sealed.ts and the HPKE code are imported
 * here, on the first seal. `ikmE`: conformance vectors only.
 */
export async function sealedReportBytes(header: ReportHeader, output: Output, publicKey: Uint8Array, ikmE?: Uint8Array): Promise<Uint8Array> {
  const { sealPayload } = await import("./sealed.js");
  const sealed = await sealPayload(
    payloadOnlyBytes(output), publicKey, header.policyId, header.policyVersion, header.policyDigest, ikmE);
  return toBinary(ReportSchema, create(ReportSchema, { ...header, payload: { case: "sealed", value: sealed } }));
}

/** Serialized Report bytes (what the outbox stores and resends unchanged). */
export function reportBytes(header: ReportHeader, output: Output): Uint8Array {
  return toBinary(ReportSchema, makeReport(header, output));
}

/** SubmitRequest bytes of reports already serialized: field 1, length-delimited, each unchanged. */
export function submitRequestBytes(reports: Uint8Array[]): Uint8Array {
  const parts: number[] = [];
  for (const report of reports) {
    parts.push(0x0a);
    let n = report.length;
    while (n > 0x7f) {
      parts.push((n & 0x7f) | 0x80);
      n >>>= 7;
    }
    parts.push(n, ...report);
  }
  return new Uint8Array(parts);
}

/** The same request through the generated encoder (tests compare both). */
export function submitRequestOf(reports: Report[]): Uint8Array {
  return toBinary(SubmitRequestSchema, create(SubmitRequestSchema, { reports }));
}
