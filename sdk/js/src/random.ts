/**
 * The device's randomness: the platform CSPRNG (`crypto.getRandomValues`), integers only.
 *
 * Every randomizer draws through four primitives, each exact:
 * `bernoulli(n)` is true with probability n / 2^53 (a uniform 53-bit integer < n),
 * `bernoulliRatio(n, d)` with probability n / d (a uniform integer below d, < n),
 * `below(n)` is uniform in [0, n) (rejection sampling, BigInt beyond 2^32), and
 * `drawIndex(total, weights, pick)` returns i with probability weights()[i] / total
 * (pick(r) of one uniform r below total; pick must map exactly weights()[i] values to i).
 *
 * A RandomSource may carry a `decider` that answers the primitives itself: the tests
 * use one that enumerates every branch with its exact weight (the exact law of a
 * randomizer as it runs), another that replays a fixed seed.
 */

/** Answers the primitives directly (tests): see the module docstring. */
export interface Decider {
  /** True with probability numerator / denominator. */
  bernoulli(numerator: bigint, denominator: bigint): boolean;
  /** Uniform in [0, n). */
  below(n: bigint): bigint;
  /** i with probability weights()[i] / total; `pick` is the sampler's map from a uniform r. */
  index(total: bigint, weights: () => bigint[], pick: (r: bigint) => number): number;
  /** `n` uniform bytes (a key drawn independently of every value). */
  bytes(n: number): Uint8Array;
}

export interface RandomSource {
  /** Fill `array` with uniform random words. */
  fill(array: Uint32Array): void;
  /** When present, answers the primitives instead of `fill` (tests). */
  decider?: Decider;
}

/** Words fetched from the CSPRNG per call (one call costs far more than copying words). */
const POOL_WORDS = 1024;
const pool = new Uint32Array(POOL_WORDS);
let poolUsed = POOL_WORDS;

/**
 * The platform CSPRNG, words handed out from a pool refilled by one
 * `crypto.getRandomValues` call per 1024 words; each word is handed out once.
 */
export const systemRandom: RandomSource = {
  fill(array: Uint32Array): void {
    if (array.length > POOL_WORDS) {
      globalThis.crypto.getRandomValues(array);
      return;
    }
    if (poolUsed + array.length > POOL_WORDS) {
      globalThis.crypto.getRandomValues(pool);
      poolUsed = 0;
    }
    array.set(pool.subarray(poolUsed, poolUsed + array.length));
    pool.fill(0, poolUsed, poolUsed + array.length);
    poolUsed += array.length;
  },
};

const PROB_ONE = 1n << 53n;

/** A uniform integer in [0, 2^53), exactly (21 + 32 random bits). */
export function uniform53(rng: RandomSource = systemRandom): number {
  const words = new Uint32Array(2);
  rng.fill(words);
  return ((words[0] as number) >>> 11) * 4294967296 + (words[1] as number);
}

/** True with probability exactly numerator / 2^53. */
export function bernoulli(numerator: bigint, rng: RandomSource = systemRandom): boolean {
  if (rng.decider) return rng.decider.bernoulli(numerator, PROB_ONE);
  return BigInt(uniform53(rng)) < numerator;
}

/** True with probability exactly numerator / denominator (one uniform draw below it). */
export function bernoulliRatio(numerator: bigint, denominator: bigint, rng: RandomSource = systemRandom): boolean {
  if (rng.decider) return rng.decider.bernoulli(numerator, denominator);
  return below(denominator, rng) < numerator;
}

/** A uniform integer in [0, n), n >= 1, exactly (rejection sampling). */
export function below(n: bigint, rng: RandomSource = systemRandom): bigint {
  if (n <= 0n) throw new Error("below() needs n >= 1");
  if (rng.decider) return rng.decider.below(n);
  const bits = n.toString(2).length;
  const words = Math.ceil(bits / 32);
  const mask = (1n << BigInt(bits)) - 1n;
  const buffer = new Uint32Array(words);
  for (;;) {
    rng.fill(buffer);
    let x = 0n;
    for (const word of buffer) x = (x << 32n) | BigInt(word);
    x &= mask;
    if (x < n) return x;
  }
}

/** `below` for a Number bound. */
export function belowNumber(n: number, rng: RandomSource = systemRandom): number {
  return Number(below(BigInt(n), rng));
}

/** Index i with probability weights()[i] / total: pick(r) of one uniform r below total. */
export function drawIndex(
  total: bigint, weights: () => bigint[], pick: (r: bigint) => number, rng: RandomSource = systemRandom,
): number {
  if (rng.decider) return rng.decider.index(total, weights, pick);
  return pick(below(total, rng));
}

/** `n` uniform random bytes (whole words drawn, the extra bytes discarded). */
export function randomBytes(n: number, rng: RandomSource = systemRandom): Uint8Array {
  if (rng.decider) return rng.decider.bytes(n);
  const words = new Uint32Array(Math.ceil(n / 4));
  rng.fill(words);
  const out = new Uint8Array(n);
  const view = new DataView(words.buffer);
  for (let i = 0; i < n; i += 1) out[i] = view.getUint8(i);
  return out;
}
