/**
 * Memoized (RAPPOR-style) randomizers: rappor-grr, rappor-oue, rappor-sue
 * (Erlingsson, Pihur, Korolova, CCS 2014, Sections 2-3; client/mechanisms/memo.py).
 *
 * A permanent response is drawn once per (user, metric, value) with ε∞
 * (`epsilon_permanent`) by the base mechanism and kept in a MemoState the client
 * persists; every report is an instantaneous randomization of it, calibrated on the
 * 2^-53 grid exactly as memo.py does (bisection for the least noise whose one-report
 * loss, from the realized permanent law, is <= ε1 against memo_loss.exp_lower(ε1)).
 * The charge per report is memo.py's `report_charge`: max(ε1, ε_I) with ε_I the
 * instantaneous step's own loss (ln p_r/q_r, or k ln (1-f)/f), computed as
 * memo_loss.py does: ratio rounded up at 50 digits, ln correctly rounded at 50
 * digits plus one unit, (times k rounded up at 50 digits), rounded up at 6 places.
 */
import {
  type Rational, ONE, PROB_ONE, ZERO, add, compare, decimalString, div, dyadic, expLower, int,
  lnUpper, mul, roundPlaces, roundSignificant, sub,
  ratioText,
} from "../exact.js";
import { type RandomSource, bernoulli, systemRandom } from "../random.js";
import { GRR, OUE, SUE, type Unary, bitsOf, bytesOf, checkIndex, checkK, otherThan } from "./categorical.js";
import { type Mechanism, MemoState, type Output, ValueError } from "./types.js";

/** Decimal places of a memoized charge (memo_loss.CHARGE_PLACES). */
export const CHARGE_PLACES = 6;
const DIGITS = 50; // memo_loss.PRECISION
const GRID: Rational = { num: 1n, den: PROB_ONE };

/** A stored index (a permanent GRR response): 4 bytes little-endian. */
export function indexBytes(index: number): Uint8Array {
  const bytes = new Uint8Array(4);
  new DataView(bytes.buffer).setUint32(0, index, true);
  return bytes;
}

/** A stored index in [0, size), or a ValueError when the memo bytes are corrupt. */
export function readIndex(stored: Uint8Array, size: number): number {
  const index = stored.length === 4 ? new DataView(stored.buffer, stored.byteOffset, 4).getUint32(0, true) : -1;
  if (index < 0 || index >= size) throw new ValueError("memo state holds a corrupt permanent response");
  return index;
}

const less = (a: Rational, b: Rational) => compare(a, b) < 0;
const max = (a: Rational, b: Rational) => (compare(a, b) >= 0 ? a : b);

/** Smallest n in [lo, hi] with holds(n 2^-53); holds is false then true (bisection). */
function leastOnGrid(holds: (x: Rational) => boolean, lo: bigint, hi: bigint): bigint {
  while (lo < hi) {
    const mid = (lo + hi) / 2n;
    if (holds(mul(int(mid), GRID))) hi = mid;
    else lo = mid + 1n;
  }
  return lo;
}

/** memo._instant_keep: the largest p_r on the grid whose one-report loss is <= ε1. */
export function instantKeep(k: number, pInf: Rational, epsilon: Rational): Rational {
  const bound = expLower(epsilon);
  const kk = int(k);
  const km1 = int(k - 1);
  const lamInf = sub(pInf, div(sub(ONE, pInf), km1));
  const leaks = (pR: Rational): boolean => {
    const lam = div(mul(lamInf, sub(mul(kk, pR), ONE)), km1);
    return compare(add(ONE, mul(km1, lam)), mul(bound, sub(ONE, lam))) > 0;
  };
  if (!leaks(ONE)) return ONE;
  const top = PROB_ONE;
  const first = leastOnGrid(leaks, (top + BigInt(k) - 1n) / BigInt(k), top);
  return mul(int(first - 1n), GRID);
}

/** memo._instant_flip: the least flip f on the grid whose one-report loss is <= ε1. */
export function instantFlip(pInf: Rational, qInf: Rational, epsilon: Rational): Rational {
  const bound = expLower(epsilon);
  const quiet = (f: Rational): boolean => {
    const keep = sub(ONE, mul(int(2), f));
    const p1 = add(f, mul(pInf, keep));
    const q1 = add(f, mul(qInf, keep));
    return compare(mul(p1, sub(ONE, q1)), mul(bound, mul(q1, sub(ONE, p1)))) <= 0;
  };
  return mul(int(leastOnGrid(quiet, 0n, PROB_ONE / 2n)), GRID);
}

const decUp = (x: Rational) => roundSignificant(x, DIGITS, "ceil");

/** memo_loss.instantaneous_rate_grr: ln p_r/q_r bounded above (50 digits). */
export function instantaneousRateGrr(k: number, pR: Rational): Rational {
  const qR = div(sub(ONE, pR), int(k - 1));
  if (qR.num === 0n) {
    throw new ValueError("the instantaneous response repeats the permanent one (epsilon = epsilon_permanent): unbounded loss");
  }
  return lnUpper(decUp(less(pR, qR) ? div(qR, pR) : div(pR, qR)), DIGITS);
}

/** memo_loss.instantaneous_rate_unary: k ln (1 - f)/f bounded above (50 digits). */
export function instantaneousRateUnary(k: number, flip: Rational): Rational {
  if (compare(flip, { num: 1n, den: 2n }) === 0) return ZERO;
  if (flip.num === 0n) {
    throw new ValueError("the instantaneous step flips no bit (epsilon = epsilon_permanent): unbounded loss");
  }
  const ln = lnUpper(decUp(div(sub(ONE, flip), flip)), DIGITS);
  return roundSignificant(mul(int(k), ln), DIGITS, "ceil");
}

/** memo_loss.sequence_charge: max(ε1, ε_I rounded up at 6 places). */
export function sequenceCharge(rate: Rational, epsilon: Rational): Rational {
  return max(epsilon, roundPlaces(rate, CHARGE_PLACES, "ceil"));
}

export abstract class Memoized implements Mechanism {
  abstract readonly id: string;
  readonly input: "index" | "number" = "index";
  readonly memoized = true;
  abstract readonly charge: Rational;
  readonly epsilonText: string;
  constructor(readonly epsilon: Rational, readonly k: number, readonly epsilonPermanent: Rational, epsilonText?: string) {
    checkK(k);
    if (epsilon.num <= 0n || epsilonPermanent.num <= 0n) throw new ValueError("epsilon and epsilon_permanent must be positive");
    if (compare(epsilon, epsilonPermanent) > 0) {
      throw new ValueError("per-report epsilon must not exceed epsilon_permanent");
    }
    this.epsilonText = epsilonText ?? decimalString(epsilon);
  }
  /** memo.py's memo_key: the mechanism and ALL its parameters, ε1 included. */
  get memoKey(): string {
    return `${this.id}|k=${this.k}|epsilon=${this.epsilonText}|epsilon_permanent=${decimalString(this.epsilonPermanent)}`;
  }
  newMemo(): MemoState {
    return new MemoState(this.memoKey);
  }
  /** The memo slots perturb(value) reads or writes: the value's own. */
  memoSlots(value: number, _memo?: MemoState): number[] {
    return [value];
  }
  protected memo(memo: MemoState | undefined): MemoState {
    if (memo === undefined) throw new ValueError(`${this.id} is memoized: pass a MemoState (newMemo)`);
    if (memo.key !== this.memoKey) throw new ValueError(`memo state belongs to other parameters; ${this.id} needs key ${this.memoKey}`);
    return memo;
  }
  abstract thresholds(): Record<string, unknown>;
  abstract perturb(value: number, rng?: RandomSource, memo?: MemoState): Output;
  abstract probability(value: number, output: Output): Rational;
  /** P[report = output | permanent response], the instantaneous step's law. */
  abstract instantProbability(permanent: Uint8Array, output: Output): Rational;
}

/** rappor-grr: permanent GRR at ε∞, instantaneous GRR keeping it with p_r (memo.py). */
export class RapporGRR extends Memoized {
  readonly id = "rappor-grr";
  readonly permanent: GRR;
  readonly pR: Rational;
  readonly charge: Rational;
  readonly keepR: bigint;
  constructor(epsilon: Rational, k: number, epsilonPermanent: Rational, epsilonText?: string) {
    super(epsilon, k, epsilonPermanent, epsilonText);
    this.permanent = new GRR(epsilonPermanent, k);
    this.pR = instantKeep(k, dyadic(this.permanent.keep), epsilon);
    this.keepR = this.pR.num * (PROB_ONE / this.pR.den); // on the grid
    this.charge = sequenceCharge(instantaneousRateGrr(k, this.pR), epsilon);
  }
  thresholds() {
    return { k: this.k, p_r_exact: ratioText(this.pR), permanent: this.permanent.thresholds() };
  }
  perturb(value: number, rng: RandomSource = systemRandom, memo?: MemoState): Output {
    checkIndex(value, this.k);
    const state = this.memo(memo);
    let stored = state.responses.get(value);
    if (stored === undefined) {
      stored = indexBytes((this.permanent.perturb(value, rng) as { index: number }).index);
      state.responses.set(value, stored);
    }
    const permanent = this.permanentIndex(stored);
    const kept = bernoulli(this.keepR, rng);
    const other = otherThan(permanent, this.k, rng); // drawn always: value-blind work
    return { kind: "category", index: kept ? permanent : other };
  }
  private permanentIndex(stored: Uint8Array): number {
    return readIndex(stored, this.k);
  }
  instantProbability(permanent: Uint8Array, output: Output): Rational {
    if (output.kind !== "category") return ZERO;
    const z = this.permanentIndex(permanent);
    return output.index === z ? this.pR : div(sub(ONE, this.pR), int(this.k - 1));
  }
  probability(value: number, output: Output): Rational {
    let total = ZERO;
    for (let z = 0; z < this.k; z += 1) {
      const perm = this.permanent.probability(value, { kind: "category", index: z });
      total = add(total, mul(perm, this.instantProbability(indexBytes(z), output)));
    }
    return total;
  }
}

/** rappor-oue / rappor-sue: permanent unary encoding at ε∞, each bit flipped w.p. f. */
abstract class MemoizedUnary extends Memoized {
  abstract readonly permanent: Unary;
  protected flipCache?: Rational;
  protected chargeCache?: Rational;
  get flip(): Rational {
    this.flipCache ??= instantFlip(dyadic(this.permanent.bitP), dyadic(this.permanent.bitQ), this.epsilon);
    return this.flipCache;
  }
  get charge(): Rational {
    this.chargeCache ??= sequenceCharge(instantaneousRateUnary(this.k, this.flip), this.epsilon);
    return this.chargeCache;
  }
  thresholds() {
    return { k: this.k, flip_exact: ratioText(this.flip), permanent: this.permanent.thresholds() };
  }
  perturb(value: number, rng: RandomSource = systemRandom, memo?: MemoState): Output {
    checkIndex(value, this.k);
    const state = this.memo(memo);
    let stored = state.responses.get(value);
    if (stored === undefined) {
      stored = (this.permanent.perturb(value, rng) as { bits: Uint8Array }).bits;
      state.responses.set(value, stored);
    }
    const permanent = this.permanentBits(stored);
    const draw = this.flip.num * (PROB_ONE / this.flip.den);
    let flips = 0n;
    for (let i = 0; i < this.k; i += 1) if (bernoulli(draw, rng)) flips |= 1n << BigInt(i);
    return { kind: "bits", bits: bytesOf(permanent ^ flips, this.k), length: this.k };
  }
  private permanentBits(stored: Uint8Array): bigint {
    const bits = bitsOf(stored);
    if (stored.length !== Math.ceil(this.k / 8) || bits >> BigInt(this.k)) {
      throw new ValueError("memo state holds a corrupt permanent response");
    }
    return bits;
  }
  instantProbability(permanent: Uint8Array, output: Output): Rational {
    if (output.kind !== "bits" || output.length !== this.k) return ZERO;
    const differ = this.permanentBits(permanent) ^ bitsOf(output.bits);
    let prob = ONE;
    for (let i = 0; i < this.k; i += 1) prob = mul(prob, (differ >> BigInt(i)) & 1n ? this.flip : sub(ONE, this.flip));
    return prob;
  }
  probability(value: number, output: Output): Rational {
    if (output.kind !== "bits" || output.length !== this.k) return ZERO;
    const bits = bitsOf(output.bits);
    const f = this.flip;
    let prob = ONE;
    for (let i = 0; i < this.k; i += 1) {
      const perm = dyadic(i === value ? this.permanent.bitP : this.permanent.bitQ);
      const one = add(mul(perm, sub(ONE, f)), mul(sub(ONE, perm), f));
      prob = mul(prob, (bits >> BigInt(i)) & 1n ? one : sub(ONE, one));
    }
    return prob;
  }
}

export class RapporOUE extends MemoizedUnary {
  readonly id = "rappor-oue";
  readonly permanent: OUE;
  constructor(epsilon: Rational, k: number, epsilonPermanent: Rational, epsilonText?: string) {
    super(epsilon, k, epsilonPermanent, epsilonText);
    this.permanent = new OUE(epsilonPermanent, k);
    void this.charge; // compute now: a deterministic instantaneous step throws at build time
  }
}

/** Basic one-hash RAPPOR. */
export class RapporSUE extends MemoizedUnary {
  readonly id = "rappor-sue";
  readonly permanent: SUE;
  constructor(epsilon: Rational, k: number, epsilonPermanent: Rational, epsilonText?: string) {
    super(epsilon, k, epsilonPermanent, epsilonText);
    this.permanent = new SUE(epsilonPermanent, k);
    void this.charge;
  }
}
