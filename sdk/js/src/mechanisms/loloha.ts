/**
 * LOLOHA: longitudinal local hashing, memoized per hash value (Arcolezi, Pinzón,
 * Palamidessi, Gambs, EDBT 2023, Section 4; client/mechanisms/loloha.py).
 *
 * One hash seed per (user, metric), uniform on [0, g^(m+1)) (OLH's contract family),
 * drawn once and stored in memo slot -1 (8 bytes little-endian); one permanent GRR
 * response over [g] at ε∞ per hash value h, stored in slot h (4 bytes little-endian);
 * each report is (seed, GRR over [g] keeping the permanent response with p_r), p_r from
 * memo._instant_keep over [g]. One report has OLH's law with keep probability
 * p1 = p∞ p_r + (g - 1) q∞ q_r. Charge: max(ε1, ε_I), ε_I = ln p_r/q_r over [g].
 */
import { type Rational, ONE, PROB_ONE, ZERO, add, div, dyadic, int, mul, ratioText, sub } from "../exact.js";
import { type RandomSource, bernoulli, below, systemRandom } from "../random.js";
import { GRR, OLH, checkIndex, otherThan, olhHash } from "./categorical.js";
import { Memoized, indexBytes, instantKeep, instantaneousRateGrr, readIndex, sequenceCharge } from "./memo.js";
import { type MemoState, type Output, ValueError } from "./types.js";

/** The memo slot of the hash seed (hash values use slots 0..g-1). */
export const SEED_SLOT = -1;

export class Loloha extends Memoized {
  readonly id = "loloha";
  readonly base: OLH;
  readonly permanent: GRR;
  readonly pR: Rational;
  readonly keepR: bigint;
  readonly p1: Rational;
  readonly charge: Rational;
  constructor(epsilon: Rational, k: number, epsilonPermanent: Rational, g?: number, epsilonText?: string) {
    super(epsilon, k, epsilonPermanent, epsilonText);
    this.base = new OLH(epsilon, k, g);
    const gg = this.base.g;
    this.permanent = new GRR(epsilonPermanent, gg);
    const pInf = dyadic(this.permanent.keep);
    const qInf = div(sub(ONE, pInf), int(gg - 1));
    this.pR = instantKeep(gg, pInf, epsilon);
    this.keepR = this.pR.num * (PROB_ONE / this.pR.den);
    const qR = div(sub(ONE, this.pR), int(gg - 1));
    this.p1 = add(mul(pInf, this.pR), mul(int(gg - 1), mul(qInf, qR)));
    this.charge = sequenceCharge(instantaneousRateGrr(gg, this.pR), epsilon);
  }
  get g(): number {
    return this.base.g;
  }
  override get memoKey(): string {
    return `${super.memoKey}|g=${this.g}`;
  }
  /** The seed's slot, then (once the seed is stored) the value's hash value's slot. */
  override memoSlots(value: number, memo?: MemoState): number[] {
    const stored = memo?.responses.get(SEED_SLOT);
    return stored === undefined ? [SEED_SLOT] : [SEED_SLOT, this.hash(this.seedOf(stored), value)];
  }
  thresholds() {
    return {
      k: this.k, g: this.g, m: this.base.m, seed_space: this.base.seedSpace, keep_r: this.keepR,
      p_r_exact: ratioText(this.pR), p1_exact: ratioText(this.p1), permanent: this.permanent.thresholds(),
    };
  }
  private seedOf(stored: Uint8Array): bigint {
    const seed = stored.length === 8 ? new DataView(stored.buffer, stored.byteOffset, 8).getBigUint64(0, true) : -1n;
    if (seed < 0n || seed >= this.base.seedSpace) throw new ValueError("memo state holds a corrupt hash seed");
    return seed;
  }
  private hash(seed: bigint, value: number): number {
    return Number(olhHash(seed, BigInt(value), BigInt(this.g), this.base.m));
  }
  perturb(value: number, rng: RandomSource = systemRandom, memo?: MemoState): Output {
    checkIndex(value, this.k);
    const state = this.memo(memo);
    let storedSeed = state.responses.get(SEED_SLOT);
    if (storedSeed === undefined) {
      storedSeed = new Uint8Array(8);
      new DataView(storedSeed.buffer).setBigUint64(0, below(this.base.seedSpace, rng), true);
      state.responses.set(SEED_SLOT, storedSeed);
    }
    const seed = this.seedOf(storedSeed);
    const hashed = this.hash(seed, value);
    let stored = state.responses.get(hashed);
    if (stored === undefined) {
      stored = indexBytes((this.permanent.perturb(hashed, rng) as { index: number }).index);
      state.responses.set(hashed, stored);
    }
    const permanent = readIndex(stored, this.g);
    const kept = bernoulli(this.keepR, rng);
    const other = otherThan(permanent, this.g, rng);
    return { kind: "hashed", seed, value: kept ? permanent : other };
  }
  instantProbability(permanent: Uint8Array, output: Output): Rational {
    if (output.kind !== "hashed") return ZERO;
    const z = readIndex(permanent, this.g);
    return output.value === z ? this.pR : div(sub(ONE, this.pR), int(this.g - 1));
  }
  /** P[(s, y) | v] of the first report: p1/|S| if y = h_s(v), else q1/|S|. */
  probability(value: number, output: Output): Rational {
    if (output.kind !== "hashed" || output.seed < 0n || output.seed >= this.base.seedSpace) return ZERO;
    const q1 = div(sub(ONE, this.p1), int(this.g - 1));
    const mass = output.value === this.hash(output.seed, value) ? this.p1 : q1;
    return div(mass, int(this.base.seedSpace));
  }
}
