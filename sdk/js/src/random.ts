/**
 * The device's randomness: the platform CSPRNG (`crypto.getRandomValues`), integers only.
 * `uniform53` is a uniform integer in [0, 2^53); `below(n)` is uniform in [0, n)
 * by rejection (exact for any n, BigInt beyond 2^32).
 */

export interface RandomSource {
  /** Fill `array` with uniform random bytes. */
  fill(array: Uint32Array): void;
}

export const systemRandom: RandomSource = {
  fill(array: Uint32Array): void {
    globalThis.crypto.getRandomValues(array);
  },
};

/** A uniform integer in [0, 2^53), exactly (21 + 32 random bits). */
export function uniform53(rng: RandomSource = systemRandom): number {
  const words = new Uint32Array(2);
  rng.fill(words);
  return ((words[0] as number) >>> 11) * 4294967296 + (words[1] as number);
}

/** True with probability exactly numerator / 2^53. */
export function bernoulli(numerator: bigint, rng: RandomSource = systemRandom): boolean {
  return BigInt(uniform53(rng)) < numerator;
}

/** A uniform integer in [0, n), n >= 1, exactly (rejection sampling). */
export function below(n: bigint, rng: RandomSource = systemRandom): bigint {
  if (n <= 0n) throw new Error("below() needs n >= 1");
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
