// Test sources of randomness: an enumerator that runs a randomizer down every branch of
// its draws with the branch's exact probability (the law the code realizes), a seeded
// source for reproducible sampling, and the chi-square upper tail.
import { type Rational, ONE, ZERO, add, mul } from "../src/exact.js";
import type { Decider, RandomSource } from "../src/random.js";

/** The key the enumerator hands out for `randomBytes(n)` (a value-independent uniform draw:
 * the law is enumerated conditionally on it, times its probability 2^-8n). */
export let fixedBytes = (n: number): Uint8Array => Uint8Array.from({ length: n }, (_, i) => (i * 37 + 11) & 0xff);

/** Use another fixed key (tests vary it). */
export function setFixedBytes(make: (n: number) => Uint8Array): void {
  fixedBytes = make;
}

/** Largest `below(n)` bound the enumerator branches over (each value is a branch). */
const MAX_BRANCHES = 1n << 16n;

interface Step { options: Rational[]; taken: number }

/**
 * Every outcome of `run(source)` with its exact probability: a depth-first walk over the
 * primitives' branches (bernoulli: 2, below(n): n, drawIndex: one per weight), each run
 * replaying a path of choices. `key` names an outcome (equal keys add up).
 */
export function enumerateLaw<T>(run: (rng: RandomSource) => T, key: (out: T) => string): Map<string, Rational> {
  const law = new Map<string, Rational>();
  let path: Step[] = [];
  for (;;) {
    let depth = 0;
    let weight: Rational = ONE;
    const choose = (options: Rational[]): number => {
      if (depth === path.length) path.push({ options, taken: 0 });
      const step = path[depth] as Step;
      depth += 1;
      weight = mul(weight, step.options[step.taken] as Rational);
      return step.taken;
    };
    const decider: Decider = {
      bernoulli(numerator, denominator) {
        return choose([{ num: numerator, den: denominator }, { num: denominator - numerator, den: denominator }]) === 0;
      },
      below(n) {
        if (n > MAX_BRANCHES) throw new Error(`enumerator: below(${n}) has too many branches`);
        return BigInt(choose(Array.from({ length: Number(n) }, () => ({ num: 1n, den: n }))));
      },
      index(total, weights) {
        return choose(weights().map((w) => ({ num: w, den: total })));
      },
      bytes(n) { // one branch: the fixed key `keyOf(n)`, with its probability 2^-8n
        weight = mul(weight, { num: 1n, den: 1n << BigInt(8 * n) });
        return fixedBytes(n);
      },
    };
    const out = run({ fill() { throw new Error("enumerator: raw words drawn"); }, decider });
    if (depth !== path.length) throw new Error("enumerator: a replayed path drew differently");
    if (weight.num !== 0n) law.set(key(out), add(law.get(key(out)) ?? ZERO, weight));
    while (path.length > 0) { // next path: advance the deepest step with options left
      const last = path[path.length - 1] as Step;
      if (last.taken + 1 < last.options.length) {
        last.taken += 1;
        break;
      }
      path.pop();
    }
    if (path.length === 0) return law;
    path = path.slice();
  }
}

/** A reproducible source (SplitMix64 words): fixed-seed sampling tests. */
export function seededSource(seed: bigint): RandomSource {
  let state = seed & 0xffffffffffffffffn;
  const next = (): bigint => {
    state = (state + 0x9e3779b97f4a7c15n) & 0xffffffffffffffffn;
    let z = state;
    z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & 0xffffffffffffffffn;
    z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & 0xffffffffffffffffn;
    return z ^ (z >> 31n);
  };
  return {
    fill(array: Uint32Array) {
      for (let i = 0; i < array.length; i += 1) array[i] = Number(next() & 0xffffffffn);
    },
  };
}

function lnGamma(x: number): number {
  const c = [76.18009172947146, -86.50532032941677, 24.01409824083091, -1.231739572450155, 0.1208650973866179e-2, -0.5395239384953e-5];
  let y = x;
  const tmp = x + 5.5 - (x + 0.5) * Math.log(x + 5.5);
  let ser = 1.000000000190015;
  for (const ci of c) ser += ci / ++y;
  return -tmp + Math.log((2.5066282746310005 * ser) / x);
}

/** P[χ²_df > x]: the regularized upper incomplete gamma Q(df/2, x/2) (series / continued fraction). */
export function chiSquareTail(x: number, df: number): number {
  const a = df / 2;
  const z = x / 2;
  if (z <= 0) return 1;
  const front = Math.exp(-z + a * Math.log(z) - lnGamma(a));
  if (z < a + 1) {
    let sum = 1 / a;
    let term = sum;
    for (let n = 1; n < 1000 && Math.abs(term) > Math.abs(sum) * 1e-15; n += 1) {
      term *= z / (a + n);
      sum += term;
    }
    return 1 - sum * front;
  }
  let b = z + 1 - a;
  let c = 1 / 1e-300;
  let d = 1 / b;
  let h = d;
  for (let i = 1; i < 1000; i += 1) {
    const an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (Math.abs(d) < 1e-300) d = 1e-300;
    c = b + an / c;
    if (Math.abs(c) < 1e-300) c = 1e-300;
    d = 1 / d;
    const delta = d * c;
    h *= delta;
    if (Math.abs(delta - 1) < 1e-15) break;
  }
  return front * h;
}

/**
 * Pearson's chi-square of `counts` (outcome -> count) against the exact law, cells with an
 * expected count below 5 pooled into one; returns the statistic, degrees of freedom and
 * P[χ² > statistic]. An outcome outside the law's support gives p = 0.
 */
export function chiSquare(counts: Map<string, number>, law: Map<string, Rational>, n: number): { stat: number; df: number; p: number } {
  for (const outcome of counts.keys()) if (!law.has(outcome)) return { stat: Infinity, df: 0, p: 0 };
  let stat = 0;
  let cells = 0;
  let pooledObserved = 0;
  let pooledExpected = 0;
  for (const [outcome, prob] of law) {
    const expected = (n * Number((prob.num * 1_000_000_000_000n) / prob.den)) / 1e12;
    const observed = counts.get(outcome) ?? 0;
    if (expected < 5) {
      pooledObserved += observed;
      pooledExpected += expected;
      continue;
    }
    stat += (observed - expected) ** 2 / expected;
    cells += 1;
  }
  if (pooledExpected > 0) {
    stat += (pooledObserved - pooledExpected) ** 2 / Math.max(pooledExpected, 1e-9);
    cells += 1;
  }
  const df = Math.max(1, cells - 1);
  return { stat, df, p: chiSquareTail(stat, df) };
}
