/**
 * Randomizers with exact integer thresholds, the same laws as the Python reference
 * (client/mechanisms/{grr,unary,olh,hadamard,subset}.py): every probability is
 * numerator / 2^53, decided exactly (`exact.dyadicFromExp`), drawn by comparing a
 * uniform 53-bit integer from `crypto.getRandomValues` with the numerator.
 * `probability(value, output)` is the exact law those thresholds realize; the
 * conformance test compares it with the vectors' rationals.
 */
import {
  type Rational, ONE, PROB_ONE, ZERO, dyadic, dyadicFromExp, half, int, mul, div, sub,
} from "../exact.js";
import { type RandomSource, bernoulli, below, belowNumber, systemRandom } from "../random.js";

import { type Mechanism, type Output, ValueError } from "./types.js";

export function checkIndex(value: number, k: number): void {
  if (!Number.isInteger(value) || value < 0 || value >= k) {
    throw new ValueError(`value must be an integer index in [0, ${k})`);
  }
}

export function checkK(k: number): void {
  if (!Number.isInteger(k) || k < 2) throw new ValueError("domain size k must be an integer >= 2");
}

/** e/(e + c) for a constant c, as a formula of e. */
export const keepFormula = (c: bigint) => (e: Rational): Rational =>
  div(e, { num: e.num + c * e.den, den: e.den });

export function bytesOf(bits: bigint, length: number): Uint8Array {
  const out = new Uint8Array(Math.ceil(length / 8));
  for (let i = 0; i < out.length; i += 1) out[i] = Number((bits >> BigInt(8 * i)) & 0xffn);
  return out;
}

export function bitsOf(bytes: Uint8Array): bigint {
  let x = 0n;
  for (let i = bytes.length - 1; i >= 0; i -= 1) x = (x << 8n) | BigInt(bytes[i] as number);
  return x;
}

export function otherThan(truth: number, size: number, rng: RandomSource): number {
  const other = belowNumber(size - 1, rng);
  return other >= truth ? other + 1 : other;
}

export abstract class Base implements Mechanism {
  abstract readonly id: string;
  readonly input = "index" as const;
  readonly memoized = false;
  readonly charge: Rational;
  constructor(readonly epsilon: Rational, readonly k: number) {
    checkK(k);
    if (epsilon.num <= 0n) throw new ValueError("epsilon must be positive");
    this.charge = epsilon;
  }
  abstract thresholds(): Record<string, bigint | number>;
  abstract perturb(value: number, rng?: RandomSource): Output;
  abstract probability(value: number, output: Output): Rational;
}

/** k-ary randomized response (Wang et al. 2017, 4.1): keep = floor(p 2^53). */
export class GRR extends Base {
  readonly id = "grr";
  readonly keep: bigint;
  constructor(epsilon: Rational, k: number) {
    super(epsilon, k);
    this.keep = dyadicFromExp(keepFormula(BigInt(k - 1)), epsilon);
  }
  thresholds() { return { k: this.k, keep: this.keep }; }
  perturb(value: number, rng: RandomSource = systemRandom): Output {
    checkIndex(value, this.k);
    const kept = bernoulli(this.keep, rng);
    const other = otherThan(value, this.k, rng); // drawn always: the work is value-blind
    return { kind: "category", index: kept ? value : other };
  }
  probability(value: number, output: Output): Rational {
    if (output.kind !== "category") return ZERO;
    const p = dyadic(this.keep);
    return output.index === value ? p : div(sub(ONE, p), int(this.k - 1));
  }
}

/** Unary encodings (Wang et al. 2017, 4.2): k independent bits, thresholds bitP, bitQ. */
export abstract class Unary extends Base {
  abstract readonly bitP: bigint;
  abstract readonly bitQ: bigint;
  thresholds() { return { k: this.k, bit_p: this.bitP, bit_q: this.bitQ }; }
  perturb(value: number, rng: RandomSource = systemRandom): Output {
    checkIndex(value, this.k);
    let bits = 0n;
    for (let i = 0; i < this.k; i += 1) {
      const one = bernoulli(i === value ? this.bitP : this.bitQ, rng);
      if (one) bits |= 1n << BigInt(i);
    }
    return { kind: "bits", bits: bytesOf(bits, this.k), length: this.k };
  }
  probability(value: number, output: Output): Rational {
    if (output.kind !== "bits" || output.length !== this.k) return ZERO;
    const bits = bitsOf(output.bits);
    let prob = ONE;
    for (let i = 0; i < this.k; i += 1) {
      const one = dyadic(i === value ? this.bitP : this.bitQ);
      prob = mul(prob, (bits >> BigInt(i)) & 1n ? one : sub(ONE, one));
    }
    return prob;
  }
}

export class OUE extends Unary {
  readonly id = "oue";
  readonly bitP = PROB_ONE / 2n;
  readonly bitQ: bigint;
  constructor(epsilon: Rational, k: number) {
    super(epsilon, k);
    this.bitQ = dyadicFromExp((e) => div(ONE, { num: e.num + e.den, den: e.den }), epsilon, true);
  }
}

export class SUE extends Unary {
  readonly id = "sue";
  readonly bitP: bigint;
  readonly bitQ: bigint;
  constructor(epsilon: Rational, k: number) {
    super(epsilon, k);
    const h = half(epsilon);
    this.bitP = dyadicFromExp(keepFormula(1n), h);
    this.bitQ = dyadicFromExp((e) => div(ONE, { num: e.num + e.den, den: e.den }), h, true);
  }
}

export function isPrime(n: number): boolean {
  if (n < 2) return false;
  if (n % 2 === 0) return n === 2;
  for (let i = 3; i * i <= n; i += 2) if (n % i === 0) return false;
  return true;
}

export function f0Variance(p: number, q: number): number {
  const gap = (p - q) ** 2;
  return gap > 0 ? (q * (1 - q)) / gap : Infinity;
}

/** OLH's default g: the prime around e^ε + 1 with the least variance (olh.default_g). */
export function defaultG(epsilon: Rational): number {
  const e = Math.exp(Number(epsilon.num) / Number(epsilon.den));
  const target = e + 1;
  let lo = Math.max(2, Math.floor(target));
  while (lo > 2 && !isPrime(lo)) lo -= 1;
  let hi = Math.max(2, Math.ceil(target));
  while (!isPrime(hi)) hi += 1;
  const cost = (g: number) => f0Variance(e / (e + g - 1), 1 / g);
  return cost(hi) < cost(lo) ? hi : lo;
}

/** h_seed(v) of the OLH dot-product family (collector.proto, HashedPayload). */
export function olhHash(seed: bigint, value: bigint, g: bigint, m: number): bigint {
  let acc = 0n;
  let s = seed;
  let v = value;
  for (let j = 0; j < m; j += 1) {
    acc += (s % g) * (v % g);
    s /= g;
    v /= g;
  }
  return (acc + s) % g;
}

/** Optimized local hashing (Wang et al. 2017, 4.4). */
export class OLH extends Base {
  readonly id = "olh";
  readonly g: number;
  readonly m: number;
  readonly seedSpace: bigint;
  readonly keep: bigint;
  constructor(epsilon: Rational, k: number, g?: number) {
    super(epsilon, k);
    const chosen = g ?? defaultG(epsilon);
    if (!Number.isInteger(chosen) || chosen < 2 || chosen > 2 ** 31 - 1 || !isPrime(chosen)) {
      throw new ValueError("olh hash range g must be a prime in [2, 2^31 - 1]");
    }
    this.g = chosen;
    let m = 1;
    while (BigInt(chosen) ** BigInt(m) < BigInt(k)) m += 1;
    this.m = m;
    this.seedSpace = BigInt(chosen) ** BigInt(m + 1);
    if (this.seedSpace > 2n ** 63n) throw new ValueError("olh seed space exceeds 2^63");
    this.keep = dyadicFromExp(keepFormula(BigInt(chosen - 1)), epsilon);
  }
  thresholds() {
    return { k: this.k, g: this.g, m: this.m, seed_space: this.seedSpace, keep: this.keep };
  }
  perturb(value: number, rng: RandomSource = systemRandom): Output {
    checkIndex(value, this.k);
    const seed = below(this.seedSpace, rng);
    const hashed = Number(olhHash(seed, BigInt(value), BigInt(this.g), this.m));
    const kept = bernoulli(this.keep, rng);
    const other = otherThan(hashed, this.g, rng);
    return { kind: "hashed", seed, value: kept ? hashed : other };
  }
  probability(value: number, output: Output): Rational {
    if (output.kind !== "hashed") return ZERO;
    const hashed = Number(olhHash(output.seed, BigInt(value), BigInt(this.g), this.m));
    const p = dyadic(this.keep);
    const mass = output.value === hashed ? p : div(sub(ONE, p), int(this.g - 1));
    return div(mass, { num: this.seedSpace, den: 1n });
  }
}

function parity(x: number): number {
  let bits = 0;
  for (let y = x; y; y &= y - 1) bits += 1;
  return bits & 1;
}

/** Hadamard response (Acharya, Sun, Zhang 2019): outputs in [0, K), K = 2^ceil(log2(k+1)). */
export class HadamardResponse extends Base {
  readonly id = "hr";
  readonly K: number;
  readonly inside: bigint;
  constructor(epsilon: Rational, k: number) {
    super(epsilon, k);
    this.K = 2 ** k.toString(2).length;
    this.inside = dyadicFromExp(keepFormula(1n), epsilon);
  }
  thresholds() { return { k: this.k, K: this.K, inside: this.inside }; }
  private inSet(value: number, y: number): boolean { return parity((value + 1) & y) === 0; }
  perturb(value: number, rng: RandomSource = systemRandom): Output {
    checkIndex(value, this.k);
    const wantIn = bernoulli(this.inside, rng);
    let y = belowNumber(this.K, rng);
    const row = value + 1;
    if (this.inSet(value, y) !== wantIn) y ^= row & -row;
    return { kind: "category", index: y };
  }
  probability(value: number, output: Output): Rational {
    if (output.kind !== "category") return ZERO;
    const p = dyadic(this.inside);
    const side = this.inSet(value, output.index) ? p : sub(ONE, p);
    return div(mul(int(2), side), int(this.K));
  }
}

/** The binomial coefficient C(n, r), exactly. */
export function comb(n: number, r: number): bigint {
  let out = 1n;
  for (let i = 0; i < r; i += 1) out = (out * BigInt(n - i)) / BigInt(i + 1);
  return out;
}

/** Subset selection (Ye and Barg 2018): a d-subset biased toward the value. */
export class SubsetSelection extends Base {
  readonly id = "ss";
  readonly d: number;
  readonly include: bigint;
  constructor(epsilon: Rational, k: number, d?: number) {
    super(epsilon, k);
    const chosen = d ?? defaultSubsetSize(epsilon, k);
    if (!Number.isInteger(chosen) || chosen < 1 || chosen > k - 1) {
      throw new ValueError(`ss subset size d must be an integer in [1, ${k - 1}]`);
    }
    this.d = chosen;
    const dd = BigInt(chosen);
    const rest = BigInt(k - chosen);
    this.include = dyadicFromExp(
      (e) => div({ num: dd * e.num, den: e.den }, { num: dd * e.num + rest * e.den, den: e.den }),
      epsilon,
    );
  }
  thresholds() { return { k: this.k, d: this.d, include: this.include }; }
  perturb(value: number, rng: RandomSource = systemRandom): Output {
    checkIndex(value, this.k);
    const included = bernoulli(this.include, rng);
    const pool = Array.from({ length: this.k - 1 }, (_, i) => (i >= value ? i + 1 : i));
    const want = included ? this.d - 1 : this.d;
    let bits = included ? 1n << BigInt(value) : 0n;
    for (let i = 0; i < want; i += 1) { // partial Fisher-Yates: a uniform subset
      const j = i + belowNumber(pool.length - i, rng);
      [pool[i], pool[j]] = [pool[j] as number, pool[i] as number];
      bits |= 1n << BigInt(pool[i] as number);
    }
    return { kind: "bits", bits: bytesOf(bits, this.k), length: this.k };
  }
  probability(value: number, output: Output): Rational {
    if (output.kind !== "bits" || output.length !== this.k) return ZERO;
    const bits = bitsOf(output.bits);
    let count = 0;
    for (let x = bits; x; x &= x - 1n) count += 1;
    if (count !== this.d) return ZERO;
    const p = dyadic(this.include);
    if ((bits >> BigInt(value)) & 1n) return div(p, int(comb(this.k - 1, this.d - 1)));
    return div(sub(ONE, p), int(comb(this.k - 1, this.d)));
  }
}

function defaultSubsetSize(epsilon: Rational, k: number): number {
  const e = Math.exp(Number(epsilon.num) / Number(epsilon.den));
  const center = k / (e + 1);
  const candidates = new Set<number>();
  for (const c of [Math.floor(center) - 1, Math.floor(center), Math.ceil(center), Math.ceil(center) + 1]) {
    candidates.add(Math.min(k - 1, Math.max(1, c)));
  }
  const cost = (d: number) => {
    const p = (d * e) / (d * e + k - d);
    return f0Variance(p, (p * (d - 1) + (1 - p) * d) / (k - 1));
  };
  return [...candidates].sort((a, b) => cost(a) - cost(b) || a - b)[0] as number;
}

