// Shared by the mechanism tests: conformance/v1/mechanisms.json and its decoding.
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import * as path from "node:path";
import { type Rational, parseDecimal, parseSignedDecimal, toDouble } from "../src/exact.js";
import { type MetricDomain, type Output, createMechanism } from "../src/mechanisms.js";
import type { Mechanism } from "../src/mechanisms/types.js";

const here = path.dirname(fileURLToPath(import.meta.url));
export const vectorsDir = path.resolve(here, "../../../../conformance/v1");

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Json = any;

export const load = (name: string): Json => JSON.parse(readFileSync(path.join(vectorsDir, name), "utf8"));

export function fromHex(text: string): Uint8Array {
  return Uint8Array.from(text.match(/../g) ?? [], (x) => parseInt(x, 16));
}

/** The double whose big-endian bits are these 16 hex digits. */
export function doubleOf(hexBits: string): number {
  const view = new DataView(new ArrayBuffer(8));
  view.setBigUint64(0, BigInt(`0x${hexBits}`));
  return view.getFloat64(0);
}

export function outputOf(json: Json): Output {
  if (json.kind === "category") return { kind: "category", index: json.index };
  if (json.kind === "bits") return { kind: "bits", bits: fromHex(json.bits), length: json.length };
  if (json.kind === "numeric") return { kind: "numeric", value: json.double !== undefined ? doubleOf(json.double) : json.value };
  if (json.kind === "multi") {
    return { kind: "multi", parts: json.parts.map((p: Json) => ({ attribute: p.attribute, output: outputOf({ ...p, kind: p.k }) })) };
  }
  if (json.kind === "sketch_row") return { kind: "sketch_row", row: json.row, bits: fromHex(json.bits), length: json.length };
  if (json.kind === "sketch_bit") return { kind: "sketch_bit", row: json.row, column: json.column, bit: json.bit };
  if (json.kind === "group_hashed") return { kind: "group_hashed", group: json.group, key: fromHex(json.key), value: json.value };
  if (json.kind === "index_bits") return { kind: "index_bits", indices: json.indices, bits: fromHex(json.bits) };
  return { kind: "hashed", seed: BigInt(json.seed), value: json.value };
}

export function domainOf(metric: Json): MetricDomain {
  if (metric.k !== undefined) return metric.k as number;
  if (metric.max_bytes !== undefined) return { maxBytes: metric.max_bytes as number };
  if (metric.attributes !== undefined) {
    return {
      attributes: metric.attributes.map((a: Json) => ({
        name: a.name, mechanism: a.mechanism,
        ...(a.k !== undefined
          ? { labels: Array.from({ length: a.k }, (_, i) => `label${i}`) }
          : { range: { lo: parseSignedDecimal(a.lo), hi: parseSignedDecimal(a.hi) } }),
      })),
    };
  }
  return { lo: parseSignedDecimal(metric.lo), hi: parseSignedDecimal(metric.hi) };
}

/** The case's mechanism built by this SDK (a policy with that id, ε, metric and params). */
export function build(c: Json): Mechanism {
  return createMechanism(c.mechanism, parseDecimal(c.epsilon), domainOf(c.metric), c.params);
}

export const str = (x: Rational): string => `${x.num}/${x.den}`;

/** The randomizer input of a law entry's value: dbitflip's laws are by bucket (its midpoint here). */
export function lawInput(c: Json, value: number): number {
  if (c.mechanism !== "dbitflip") return value;
  const lo = parseSignedDecimal(c.metric.lo);
  const hi = parseSignedDecimal(c.metric.hi);
  const k = BigInt(c.params.buckets);
  const width = { num: (hi.num * lo.den - lo.num * hi.den), den: hi.den * lo.den * k };
  const mid = { num: lo.num * width.den * 2n + (2n * BigInt(value) + 1n) * width.num * lo.den, den: lo.den * width.den * 2n };
  return toDouble(mid);
}
