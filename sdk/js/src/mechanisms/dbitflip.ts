/**
 * dBitFlipPM: memoized d-bit flipping over the buckets of a numeric range (Ding,
 * Kulkarni, Yekhanin, "Collecting Telemetry Data Privately", NeurIPS 2017, Sections 3-4;
 * client/mechanisms/dbitflip.py).
 *
 * [lo, hi] is cut into k equal buckets; bucket(x) = min(floor((x - lo) k/(hi - lo)), k - 1)
 * exactly, x clipped. Once per (user, metric) the device draws d distinct bucket indices
 * uniformly (memo slot -1: 4 bytes little-endian each, increasing); its d-bit vector is
 * b_p = 1[bucket(x) = j_p]. Permanent response per distinct vector (slot 0: the zero
 * vector, slot 1 + p: the unit vector p; ceil(d/8) packed bytes): each bit flipped with
 * SUE(ε∞)'s q∞. Every report flips each permanent bit with f (memo._instant_flip).
 * Charge: max(ε1, ε_I), ε_I = d ln (1 - f)/f.
 */
import {
  type Rational, ONE, PROB_ONE, ZERO, add, compare, decimalString, div, dyadic, floorOf, fromDouble, int, mul, sub,
  ratioText,
} from "../exact.js";
import { type RandomSource, bernoulli, belowNumber, systemRandom } from "../random.js";
import { SUE, bitsOf, bytesOf, comb } from "./categorical.js";
import { Memoized, instantFlip, instantaneousRateUnary, sequenceCharge } from "./memo.js";
import type { NumericRange } from "./numeric.js";
import { type MemoState, type Output, ValueError } from "./types.js";

export const INDEX_SLOT = -1;
const MAX_BUCKETS = 4096;

const signedDecimal = (x: Rational) => (x.num < 0n ? `-${decimalString({ num: -x.num, den: x.den })}` : decimalString(x));


export class DBitFlip extends Memoized {
  readonly id = "dbitflip";
  override readonly input = "number" as const;
  readonly d: number;
  readonly permanentFlip: bigint;
  readonly flip: Rational;
  readonly p1: Rational;
  readonly charge: Rational;
  constructor(epsilon: Rational, readonly range: NumericRange, buckets: number, epsilonPermanent: Rational, d?: number, epsilonText?: string) {
    if (!Number.isInteger(buckets) || buckets < 2 || buckets > MAX_BUCKETS) throw new ValueError(`dbitflip needs 2 <= buckets <= ${MAX_BUCKETS}`);
    super(epsilon, buckets, epsilonPermanent, epsilonText);
    if (compare(range.lo, range.hi) >= 0) throw new ValueError("dbitflip needs a finite range lo < hi");
    this.d = d ?? 1;
    if (!Number.isInteger(this.d) || this.d < 1 || this.d > buckets) throw new ValueError("dbitflip needs 1 <= d <= buckets");
    const sue = new SUE(epsilonPermanent, 2);
    this.permanentFlip = sue.bitQ;
    const pInf = dyadic(sue.bitP);
    this.flip = instantFlip(pInf, dyadic(sue.bitQ), epsilon);
    this.p1 = add(this.flip, mul(pInf, sub(ONE, mul(int(2), this.flip))));
    this.charge = sequenceCharge(instantaneousRateUnary(this.d, this.flip), epsilon);
  }
  override get memoKey(): string {
    return `${super.memoKey}|lo=${signedDecimal(this.range.lo)}|hi=${signedDecimal(this.range.hi)}|d=${this.d}`;
  }
  thresholds() {
    return { k: this.k, d: this.d, permanent_flip: this.permanentFlip, flip_exact: ratioText(this.flip), p1_exact: ratioText(this.p1) };
  }
  /** The bucket of a finite value, clipped into [lo, hi] (exact rationals). */
  bucket(value: number): number {
    if (typeof value !== "number" || !Number.isFinite(value)) throw new ValueError("dbitflip values must be finite numbers");
    let x = fromDouble(value);
    if (compare(x, this.range.lo) < 0) x = this.range.lo;
    if (compare(x, this.range.hi) > 0) x = this.range.hi;
    const u = floorOf(div(mul(sub(x, this.range.lo), int(this.k)), sub(this.range.hi, this.range.lo)));
    return Math.min(Number(u), this.k - 1);
  }
  private indicesOf(stored: Uint8Array): number[] {
    const view = new DataView(stored.buffer, stored.byteOffset, stored.length);
    if (stored.length !== 4 * this.d) throw new ValueError("memo state holds corrupt bucket indices");
    const indices = Array.from({ length: this.d }, (_, i) => view.getUint32(4 * i, true));
    if (indices.some((j, i) => j >= this.k || (i > 0 && j <= (indices[i - 1] as number)))) {
      throw new ValueError("memo state holds corrupt bucket indices");
    }
    return indices;
  }
  private slotOf(indices: number[], value: number): number {
    return indices.indexOf(this.bucket(value)) + 1; // 0: the zero vector
  }
  /** The indices' slot, then (once they are stored) the value's vector's slot. */
  override memoSlots(value: number, memo?: MemoState): number[] {
    const stored = memo?.responses.get(INDEX_SLOT);
    return stored === undefined ? [INDEX_SLOT] : [INDEX_SLOT, this.slotOf(this.indicesOf(stored), value)];
  }
  private flips(numerator: bigint, rng: RandomSource): bigint {
    let bits = 0n;
    for (let i = 0; i < this.d; i += 1) if (bernoulli(numerator, rng)) bits |= 1n << BigInt(i);
    return bits;
  }
  perturb(value: number, rng: RandomSource = systemRandom, memo?: MemoState): Output {
    this.bucket(value);
    const state = this.memo(memo);
    let stored = state.responses.get(INDEX_SLOT);
    if (stored === undefined) { // a uniform d-subset: partial Fisher-Yates, then sorted
      const pool = Array.from({ length: this.k }, (_, i) => i);
      for (let i = 0; i < this.d; i += 1) {
        const j = i + belowNumber(this.k - i, rng);
        [pool[i], pool[j]] = [pool[j] as number, pool[i] as number];
      }
      const chosen = pool.slice(0, this.d).sort((a, b) => a - b);
      stored = new Uint8Array(4 * this.d);
      const view = new DataView(stored.buffer);
      chosen.forEach((j, i) => view.setUint32(4 * i, j, true));
      state.responses.set(INDEX_SLOT, stored);
    }
    const indices = this.indicesOf(stored);
    const slot = this.slotOf(indices, value);
    const width = Math.ceil(this.d / 8);
    let response = state.responses.get(slot);
    if (response === undefined) {
      const vector = slot === 0 ? 0n : 1n << BigInt(slot - 1);
      response = bytesOf(vector ^ this.flips(this.permanentFlip, rng), this.d);
      state.responses.set(slot, response);
    }
    const permanent = bitsOf(response);
    if (response.length !== width || permanent >> BigInt(this.d)) throw new ValueError("memo state holds a corrupt permanent response");
    const flip = this.flip.num * (PROB_ONE / this.flip.den);
    return { kind: "index_bits", indices, bits: bytesOf(permanent ^ this.flips(flip, rng), this.d) };
  }
  instantProbability(permanent: Uint8Array, output: Output): Rational {
    if (output.kind !== "index_bits") return ZERO;
    const differ = bitsOf(permanent) ^ bitsOf(output.bits);
    let prob = ONE;
    for (let i = 0; i < this.d; i += 1) prob = mul(prob, (differ >> BigInt(i)) & 1n ? this.flip : sub(ONE, this.flip));
    return prob;
  }
  /** P[first report = output | bucket] from the realized thresholds (dbitflip.exact_probability). */
  bucketProbability(bucket: number, output: Output): Rational {
    if (output.kind !== "index_bits" || output.indices.length !== this.d) return ZERO;
    const bits = bitsOf(output.bits);
    let prob: Rational = { num: 1n, den: comb(this.k, this.d) };
    output.indices.forEach((j, p) => {
      const one = j === bucket ? this.p1 : sub(ONE, this.p1);
      prob = mul(prob, (bits >> BigInt(p)) & 1n ? one : sub(ONE, one));
    });
    return prob;
  }
  probability(value: number, output: Output): Rational {
    return this.bucketProbability(this.bucket(value), output);
  }
}
