/**
 * PEM: heavy-hitter discovery over an open string domain by prefix extension (Wang, Li,
 * Lin, Jha, IEEE TDSC 2019, Section IV; client/mechanisms/pem.py).
 *
 * A value's UTF-8 bytes are padded with zeros to L = max_bytes. The device draws its group
 * j = below(G) (G = (8L - start_bits)/step_bits), a uniform key of 8(c + 1) bytes
 * (c = ceil(L/4)), hashes its prefix of start_bits + (j + 1) step_bits bits with the
 * contract's multiply-add-shift family h_key(x) = ((b + Σ a_i x_i) mod 2^64) >> (64 - l)
 * (Dietzfelbinger 1996; Thorup 2015, Section 3.5) into [0, g), g = 2^l, and reports the
 * hash with p = e^ε/(e^ε + g - 1) rounded down to the 2^-53 grid, otherwise one of the
 * g - 1 others uniformly (optimized local hashing, Wang et al., USENIX Security 2017, 4.4).
 */
import { type Rational, ONE, ZERO, div, dyadic, dyadicFromExp, int, mul, sub } from "../exact.js";
import { type RandomSource, bernoulli, belowNumber, randomBytes, systemRandom } from "../random.js";
import { f0Variance, otherThan } from "./categorical.js";
import { type OpenDomain, encodeOpen } from "./sketch.js";
import { type Mechanism, type Output, ValueError } from "./types.js";

const STEP_BITS = [1, 2, 4, 8];
const MAX_FIRST_BITS = 16;
const MAX_GROUPS = 512;
const MAX_HASH_BITS = 31;
const WORD = (1n << 64n) - 1n;

/** The 32-bit little-endian chunks of the first `bits` bits of `padded` (later bits zero). */
export function prefixChunks(padded: Uint8Array, bits: number): bigint[] {
  const chunks = Math.ceil(padded.length / 4);
  const data = new Uint8Array(4 * chunks);
  const whole = Math.floor(bits / 8);
  const extra = bits % 8;
  data.set(padded.subarray(0, whole));
  if (extra) data[whole] = (padded[whole] as number) & (0xff << (8 - extra)) & 0xff;
  const view = new DataView(data.buffer);
  return Array.from({ length: chunks }, (_, i) => BigInt(view.getUint32(4 * i, true)));
}

/** h_key(chunks) of the contract: key = c + 1 little-endian 64-bit words a_0..a_{c-1}, b. */
export function pemHash(key: Uint8Array, chunks: bigint[], outBits: number): number {
  const view = new DataView(key.buffer, key.byteOffset, key.length);
  let acc = view.getBigUint64(8 * chunks.length, true);
  chunks.forEach((x, i) => { acc += view.getBigUint64(8 * i, true) * x; });
  return Number((acc & WORD) >> BigInt(64 - outBits));
}

/** The power of two g with the least f = 0 variance of local hashing at ε (ties: smaller). */
export function pemDefaultG(epsilon: Rational): number {
  const e = Math.exp(Number(epsilon.num) / Number(epsilon.den));
  let best = 1;
  let bestCost = Infinity;
  for (let bits = 1; bits <= MAX_HASH_BITS; bits += 1) {
    const g = 2 ** bits;
    const cost = f0Variance(e / (e + g - 1), 1 / g);
    if (cost < bestCost) { best = bits; bestCost = cost; }
  }
  return 2 ** best;
}

export class PEM implements Mechanism {
  readonly id = "pem";
  readonly input = "string" as const;
  readonly memoized = false;
  readonly charge: Rational;
  readonly stepBits: number;
  readonly startBits: number;
  readonly groups: number;
  readonly g: number;
  readonly hashBits: number;
  readonly keyBytes: number;
  readonly keep: bigint;
  constructor(readonly epsilon: Rational, readonly domain: OpenDomain, params: Record<string, string> = {}) {
    const intParam = (name: string): number | undefined => {
      const text = params[name];
      if (text === undefined) return undefined;
      if (!/^[0-9]{1,19}$/.test(text)) throw new ValueError(`pem parameter ${name} must be a plain integer`);
      return Number(text);
    };
    this.stepBits = intParam("step_bits") ?? 4;
    this.startBits = intParam("start_bits") ?? 4;
    const total = 8 * domain.maxBytes;
    if (!STEP_BITS.includes(this.stepBits)) throw new ValueError(`pem step_bits must be one of ${STEP_BITS.join(", ")}`);
    if (this.startBits > MAX_FIRST_BITS - this.stepBits) throw new ValueError("pem start_bits + step_bits must be at most 16");
    if (total - this.startBits <= 0 || (total - this.startBits) % this.stepBits !== 0) {
      throw new ValueError("pem needs 8 * max_bytes - start_bits to be a positive multiple of step_bits");
    }
    this.groups = (total - this.startBits) / this.stepBits;
    const stated = intParam("groups");
    if (stated !== undefined && stated !== this.groups) throw new ValueError(`pem groups must be ${this.groups}`);
    if (this.groups > MAX_GROUPS) throw new ValueError(`pem would need more than ${MAX_GROUPS} groups`);
    this.g = intParam("g") ?? pemDefaultG(epsilon);
    if (this.g < 2 || this.g > 2 ** MAX_HASH_BITS || (this.g & (this.g - 1)) !== 0) {
      throw new ValueError("pem hash range g must be a power of two in [2, 2^31]");
    }
    this.hashBits = Math.log2(this.g);
    this.keyBytes = 8 * (Math.ceil(domain.maxBytes / 4) + 1);
    const gm1 = BigInt(this.g - 1);
    this.keep = dyadicFromExp((e) => div(e, { num: e.num + gm1 * e.den, den: e.den }), epsilon);
    this.charge = epsilon;
  }
  thresholds() {
    return { g: this.g, groups: this.groups, hash_bits: this.hashBits, key_bytes: this.keyBytes, keep: this.keep, step_bits: this.stepBits, start_bits: this.startBits };
  }
  /** The padded bytes of a value (validated as the open domain requires). */
  pad(value: string): Uint8Array {
    const padded = new Uint8Array(this.domain.maxBytes);
    padded.set(encodeOpen(this.domain, value));
    return padded;
  }
  prefixBits(group: number): number {
    return this.startBits + (group + 1) * this.stepBits;
  }
  perturb(value: string, rng: RandomSource = systemRandom): Output {
    const padded = this.pad(value);
    const group = belowNumber(this.groups, rng);
    const key = randomBytes(this.keyBytes, rng);
    const hashed = pemHash(key, prefixChunks(padded, this.prefixBits(group)), this.hashBits);
    const kept = bernoulli(this.keep, rng);
    const other = otherThan(hashed, this.g, rng); // drawn always: value-blind work
    return { kind: "group_hashed", group, key, value: kept ? hashed : other };
  }
  probability(value: string, output: Output): Rational {
    if (output.kind !== "group_hashed" || output.group < 0 || output.group >= this.groups || output.key.length !== this.keyBytes) return ZERO;
    const hashed = pemHash(output.key, prefixChunks(this.pad(value), this.prefixBits(output.group)), this.hashBits);
    const p = dyadic(this.keep);
    const mass = output.value === hashed ? p : div(sub(ONE, p), int(this.g - 1));
    return mul(mass, { num: 1n, den: BigInt(this.groups) << BigInt(8 * this.keyBytes) });
  }
}
