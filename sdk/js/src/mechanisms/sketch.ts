/**
 * Count Mean Sketch and Hadamard Count Mean Sketch over open string domains (Apple
 * Differential Privacy Team, "Learning with Privacy at Scale", 2017, Algorithms 1 and 3;
 * client/mechanisms/sketch.py).
 *
 * Hash family (the wire contract): h_j(s) = first 8 bytes of SHA-256("fedldp/v1/sketch\0"
 * || j as 4 bytes big-endian || UTF-8 s), big-endian, mod m (m a power of two).
 * cms: row j = below(k); the m-bit one-hot vector of h_j(s), every bit flipped with
 * f = 1/(1 + e^{ε/2}) rounded up to the 2^-53 grid. hcms: row j = below(k), column
 * l = below(m), the Hadamard coefficient (-1)^popcount(h_j(s) & l) kept with
 * p = e^ε/(1 + e^ε) rounded down, else negated (wire bit true for +1).
 */
import { type Rational, ONE, PROB_ONE, ZERO, div, dyadic, dyadicFromExp, half, int, mul, sub } from "../exact.js";
import { type RandomSource, bernoulli, belowNumber, systemRandom } from "../random.js";
import { sha256Sync } from "../sha256.js";
import { bitsOf, bytesOf } from "./categorical.js";
import { type Mechanism, type Output, ValueError } from "./types.js";

const HASH_TAG = new TextEncoder().encode("fedldp/v1/sketch\0");
export const DEFAULT_ROWS = 64;
export const DEFAULT_COLUMNS = 1024;
const MAX_ROWS = 65536;
const MAX_COLUMNS = 16384;
const MAX_CELLS = 1 << 20;
export const MAX_OPEN_DOMAIN_BYTES = 64;
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** An open string domain: 1..maxBytes UTF-8 bytes, no NUL (base.OpenDomain). */
export interface OpenDomain { maxBytes: number }

/** The UTF-8 bytes of an open-domain value; errors never echo it. */
export function encodeOpen(domain: OpenDomain, value: unknown): Uint8Array {
  if (typeof value !== "string") throw new ValueError(`an open-domain value must be a string, not a ${typeof value}`);
  if (LONE_SURROGATE.test(value)) throw new ValueError("an open-domain value must be valid Unicode (no lone surrogates)");
  const data = new TextEncoder().encode(value);
  if (data.length === 0) throw new ValueError("an open-domain value must not be empty");
  if (data.length > domain.maxBytes) throw new ValueError(`an open-domain value is longer than max_bytes (${domain.maxBytes} UTF-8 bytes)`);
  if (data.includes(0)) throw new ValueError("an open-domain value must not contain a NUL character");
  return data;
}

/** h_row(data) of the sketch family. */
export function sketchHash(row: number, data: Uint8Array, columns: number): number {
  const input = new Uint8Array(HASH_TAG.length + 4 + data.length);
  input.set(HASH_TAG, 0);
  new DataView(input.buffer).setUint32(HASH_TAG.length, row);
  input.set(data, HASH_TAG.length + 4);
  const digest = new DataView(sha256Sync(input).buffer);
  return Number(digest.getBigUint64(0) & BigInt(columns - 1));
}

function popcount(x: number): number {
  let n = 0;
  for (let y = x; y; y &= y - 1) n += 1;
  return n;
}

export abstract class Sketch implements Mechanism {
  abstract readonly id: string;
  readonly input = "string" as const;
  readonly memoized = false;
  readonly charge: Rational;
  readonly k: number;
  readonly m: number;
  constructor(readonly epsilon: Rational, readonly domain: OpenDomain, params: Record<string, string>, id: string) {
    if (epsilon.num <= 0n) throw new ValueError("epsilon must be positive");
    const int_ = (name: string, fallback: number) => {
      const text = params[name];
      if (text === undefined) return fallback;
      if (!/^[0-9]{1,19}$/.test(text)) throw new ValueError(`${id} parameter ${name} must be a plain integer`);
      return Number(text);
    };
    this.k = int_("rows", DEFAULT_ROWS);
    this.m = int_("columns", DEFAULT_COLUMNS);
    if (this.k < 1 || this.k > MAX_ROWS) throw new ValueError(`${id} parameter rows must be in [1, ${MAX_ROWS}]`);
    if (this.m < 2 || this.m > MAX_COLUMNS || (this.m & (this.m - 1)) !== 0) throw new ValueError(`${id} parameter columns must be a power of two in [2, ${MAX_COLUMNS}]`);
    if (this.k * this.m > MAX_CELLS) throw new ValueError(`${id}: rows x columns must be at most ${MAX_CELLS} cells`);
    this.charge = epsilon;
  }
  /** [h_0(value), ..., h_{k-1}(value)]. */
  cells(value: string): number[] {
    const data = encodeOpen(this.domain, value);
    return Array.from({ length: this.k }, (_, j) => sketchHash(j, data, this.m));
  }
  abstract thresholds(): Record<string, unknown>;
  abstract perturb(value: string, rng?: RandomSource): Output;
  abstract probability(value: string, output: Output): Rational;
}

export class CMS extends Sketch {
  readonly id = "cms";
  readonly flip: bigint;
  constructor(epsilon: Rational, domain: OpenDomain, params: Record<string, string> = {}) {
    super(epsilon, domain, params, "cms");
    this.flip = dyadicFromExp((h) => div(ONE, { num: h.num + h.den, den: h.den }), half(epsilon), true);
  }
  thresholds() {
    return { k: this.k, m: this.m, flip: this.flip, keep: PROB_ONE - this.flip };
  }
  perturb(value: string, rng: RandomSource = systemRandom): Output {
    const data = encodeOpen(this.domain, value);
    const row = belowNumber(this.k, rng);
    let bits = 1n << BigInt(sketchHash(row, data, this.m));
    for (let i = 0; i < this.m; i += 1) if (bernoulli(this.flip, rng)) bits ^= 1n << BigInt(i);
    return { kind: "sketch_row", row, bits: bytesOf(bits, this.m), length: this.m };
  }
  probability(value: string, output: Output): Rational {
    if (output.kind !== "sketch_row" || output.length !== this.m || output.row < 0 || output.row >= this.k) return ZERO;
    const cell = this.cells(value)[output.row] as number;
    let flipped = bitsOf(output.bits) ^ (1n << BigInt(cell));
    let count = 0;
    for (; flipped; flipped &= flipped - 1n) count += 1;
    const q = dyadic(this.flip);
    const p = sub(ONE, q);
    let prob: Rational = { num: 1n, den: BigInt(this.k) };
    for (let i = 0; i < this.m; i += 1) prob = mul(prob, i < count ? q : p);
    return prob;
  }
}

export class HCMS extends Sketch {
  readonly id = "hcms";
  readonly keep: bigint;
  constructor(epsilon: Rational, domain: OpenDomain, params: Record<string, string> = {}) {
    super(epsilon, domain, params, "hcms");
    this.keep = dyadicFromExp((e) => div(e, { num: e.num + e.den, den: e.den }), epsilon);
  }
  thresholds() {
    return { k: this.k, m: this.m, keep: this.keep };
  }
  perturb(value: string, rng: RandomSource = systemRandom): Output {
    const data = encodeOpen(this.domain, value);
    const row = belowNumber(this.k, rng);
    const column = belowNumber(this.m, rng);
    const kept = bernoulli(this.keep, rng);
    const truth = popcount(sketchHash(row, data, this.m) & column) % 2 === 0;
    return { kind: "sketch_bit", row, column, bit: truth === kept };
  }
  probability(value: string, output: Output): Rational {
    if (output.kind !== "sketch_bit" || output.row < 0 || output.row >= this.k || output.column < 0 || output.column >= this.m) return ZERO;
    const truth = popcount((this.cells(value)[output.row] as number) & output.column) % 2 === 0;
    const p = dyadic(this.keep);
    return div(output.bit === truth ? p : sub(ONE, p), int(this.k * this.m));
  }
}
