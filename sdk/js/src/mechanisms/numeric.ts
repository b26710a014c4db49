/**
 * Numeric randomizers on finite grids: duchi, piecewise, hybrid, sw
 * (client/mechanisms/numeric.py and square_wave.py, whose docstrings derive the laws).
 *
 * Duchi, Jordan, Wainwright, JASA 2018 and Wang et al., "Collecting and Analyzing
 * Multidimensional Data with Local Differential Privacy", ICDE 2019, Sections III-A
 * (duchi), III-B (piecewise), III-C (hybrid); Li et al., SIGMOD 2020, Section 4 (sw).
 *
 * One report: clip x to [lo, hi] (a double outside becomes the double of the bound);
 * U = round(J 2^64 (x - lo)/(hi - lo)) with x the exact rational of the double
 * (ties up, clamped to [0, J 2^64]); level floor(U / 2^64) + 1 when a uniform
 * 64-bit draw is below U mod 2^64, else floor(U / 2^64); then an output index i
 * drawn with the integer weights W(i | level) (one uniform draw below their total)
 * and the wire value table[i], the correctly rounded double of an exact rational
 * fixed by the policy. Every probability is an exact rational (`probability`), and
 * W(i|j)/W(i|j') <= a/b <= e^ε with a = floor(e^ε 2^P), b = 2^P (numeric.Weights).
 */
import {
  type Rational, ZERO, add, compare, div, expFloor, fromDouble, int, mul, parseDecimal,
  roundExp, sub, toDouble,
  ratioText,
} from "../exact.js";
import { type RandomSource, bernoulliRatio, drawIndex, systemRandom } from "../random.js";
import { type Mechanism, type Output, ValueError } from "./types.js";

const ROUNDING_BITS = 64n;
const WEIGHT_BITS = 32;
const MAX_TOTAL_WEIGHT = 1n << 62n;
export const DEFAULT_LEVELS = 256;
const MIN_LEVELS = 2;
const MAX_LEVELS = 4096;
const HYBRID_EPSILON_STAR = parseDecimal("0.61");

/** Integers a > b >= 1 with a/b <= e^ε (numeric.Weights.for_epsilon). */
export interface Weights { high: bigint; low: bigint }

export function weightsFor(epsilon: Rational, maxMultiplier: number): Weights {
  for (let bits = WEIGHT_BITS; bits >= 8; bits -= 1) {
    const high = expFloor(epsilon, 1n << BigInt(bits));
    if (high * BigInt(maxMultiplier) < MAX_TOTAL_WEIGHT) {
      const low = 1n << BigInt(bits);
      if (high <= low) throw new ValueError("epsilon is too small for a numeric grid");
      return { high, low };
    }
  }
  throw new ValueError("epsilon is too large for a grid of this size; use fewer levels");
}

/** w = max(1, round(J e^{-ε/2})) (numeric.default_band). */
export function defaultBand(epsilon: Rational, levels: number): number {
  const w = roundExp({ num: -epsilon.num, den: 2n * epsilon.den }, (e) => mul(e, int(levels)), "nearest");
  return Math.max(1, Number(w));
}

/** W = max(1, min(J, round(2 b J))), b = (ε e - e + 1)/(2 e (e - 1 - ε)) (numeric.square_wave_band). */
export function squareWaveBand(epsilon: Rational, levels: number): number {
  const formula = (e: Rational) => {
    const b = div(add(sub(mul(epsilon, e), e), int(1)), mul(mul(int(2), e), sub(sub(e, int(1)), epsilon)));
    return mul(int(2 * levels), b);
  };
  const w = roundExp(epsilon, formula, "nearest");
  return Math.max(1, Math.min(levels, Number(w)));
}

function plainInt(params: Record<string, string>, name: string): number | undefined {
  const text = params[name];
  if (text === undefined) return undefined;
  if (!/^[0-9]{1,6}$/.test(text)) throw new ValueError(`parameter ${name} must be a plain integer (digits only)`);
  return Number(text);
}

/** (J, N) from the policy's params, defaults derived as numeric.grid_size does. */
export function gridSize(id: string, epsilon: Rational, params: Record<string, string>): [number, number] {
  const levels = plainInt(params, "levels") ?? DEFAULT_LEVELS;
  if (levels < MIN_LEVELS || levels > MAX_LEVELS) throw new ValueError(`${id} parameter levels must be in [${MIN_LEVELS}, ${MAX_LEVELS}]`);
  const cells = plainInt(params, "cells") ?? levels + (id === "sw" ? squareWaveBand : defaultBand)(epsilon, levels);
  if (!(levels < cells && cells <= 2 * levels)) throw new ValueError(`${id} parameter cells must be in [levels + 1, 2 * levels]`);
  return [levels, cells];
}

/** The numeric range of a metric, as exact rationals of its decimal bounds. */
export interface NumericRange { lo: Rational; hi: Rational }

export abstract class NumericMechanism implements Mechanism {
  abstract readonly id: string;
  readonly input = "number" as const;
  readonly memoized = false;
  readonly charge: Rational;
  readonly loDouble: number;
  readonly hiDouble: number;
  /** Exact output values y_i (the wire values are their doubles, `table`). */
  values: Rational[] = [];
  table: number[] = [];
  constructor(readonly epsilon: Rational, readonly range: NumericRange, readonly levels: number) {
    if (epsilon.num <= 0n) throw new ValueError("epsilon must be positive");
    if (compare(range.lo, range.hi) >= 0) throw new ValueError("numeric range needs lo < hi");
    this.charge = epsilon;
    this.loDouble = toDouble(range.lo);
    this.hiDouble = toDouble(range.hi);
  }
  protected setTable(values: Rational[]): void {
    this.values = values;
    this.table = values.map(toDouble);
  }
  /** (value clipped to [lo, hi] as a double, whether it was clipped). */
  clip(value: number): [number, boolean] {
    if (typeof value !== "number" || !Number.isFinite(value)) throw new ValueError("value must be a finite number");
    const x = fromDouble(value);
    if (compare(x, this.range.lo) < 0) return [this.loDouble, true];
    if (compare(x, this.range.hi) > 0) return [this.hiDouble, true];
    return [value, false];
  }
  /** U = round(u 2^64), u = J (x - lo)/(hi - lo), ties up, clamped to [0, J 2^64]. */
  gridPosition(clipped: number): bigint {
    const r = div(sub(fromDouble(clipped), this.range.lo), sub(this.range.hi, this.range.lo));
    const scale = BigInt(this.levels) << ROUNDING_BITS;
    let den = r.den;
    let num = r.num;
    if (den < 0n) { num = -num; den = -den; }
    const twice = 2n * scale * num + den;
    let u = twice / (2n * den);
    if (twice < 0n && twice % (2n * den) !== 0n) u -= 1n; // floor
    return u < 0n ? 0n : u > scale ? scale : u;
  }
  /** The exact law of the input level of `value` (clipped first). */
  levelLaw(value: number): Array<[number, Rational]> {
    const u = this.gridPosition(this.clip(value)[0]);
    const low = Number(u >> ROUNDING_BITS);
    const rest = u & ((1n << ROUNDING_BITS) - 1n);
    if (rest === 0n) return [[low, int(1)]];
    const up = { num: rest, den: 1n << ROUNDING_BITS };
    return [[low, sub(int(1), up)], [low + 1, up]];
  }
  abstract indexWeights(level: number): bigint[];
  protected abstract sampleIndex(level: number, rng: RandomSource): number;
  perturb(value: number, rng: RandomSource = systemRandom): Output {
    const u = this.gridPosition(this.clip(value)[0]);
    const rest = u & ((1n << ROUNDING_BITS) - 1n);
    const up = bernoulliRatio(rest, 1n << ROUNDING_BITS, rng); // always one 64-bit draw
    const level = Number(u >> ROUNDING_BITS) + (up ? 1 : 0);
    return { kind: "numeric", value: this.table[this.sampleIndex(level, rng)] as number };
  }
  /** P[the report is this double, bit for bit | value], exactly (0 off the table). */
  probability(value: number, output: Output): Rational {
    if (output.kind !== "numeric") return ZERO;
    let total = ZERO;
    for (const [level, p] of this.levelLaw(value)) {
      const weights = this.indexWeights(level);
      let mass = 0n;
      let sum = 0n;
      weights.forEach((w, i) => {
        sum += w;
        if (Object.is(this.table[i], output.value)) mass += w;
      });
      total = add(total, mul(p, { num: mass, den: sum }));
    }
    return total;
  }
  thresholds(): Record<string, unknown> {
    return { levels: this.levels };
  }
}

function duchiWeights(w: Weights, levels: number, level: number): [bigint, bigint] {
  const plus = BigInt(levels) * w.low + (w.high - w.low) * BigInt(level);
  return [BigInt(levels) * (w.high + w.low) - plus, plus];
}

const duchiValue = (w: Weights): Rational => ({ num: w.high + w.low, den: w.high - w.low });
const neg = (x: Rational): Rational => ({ num: -x.num, den: x.den });

/** Duchi et al.: two outputs ±B, B = (a + b)/(a - b), J = 1. */
export class Duchi extends NumericMechanism {
  readonly id = "duchi";
  readonly weights: Weights;
  readonly B: Rational;
  constructor(epsilon: Rational, range: NumericRange) {
    super(epsilon, range, 1);
    this.weights = weightsFor(epsilon, 2);
    this.B = duchiValue(this.weights);
    this.setTable([neg(this.B), this.B]);
  }
  indexWeights(level: number): bigint[] {
    return duchiWeights(this.weights, 1, level);
  }
  protected sampleIndex(level: number, rng: RandomSource): number {
    const [minus, plus] = duchiWeights(this.weights, 1, level);
    return bernoulliRatio(plus, minus + plus, rng) ? 1 : 0;
  }
  override thresholds() {
    return { levels: 1, B_exact: ratioText(this.B) };
  }
}

/** The discrete piecewise law: J levels, N = J + w cells, band weight a, others b. */
export class PiecewiseGrid {
  readonly band: number;
  readonly total: bigint;
  constructor(readonly levels: number, readonly cells: number, readonly weights: Weights) {
    this.band = cells - levels;
    this.total = BigInt(this.band) * weights.high + BigInt(levels) * weights.low;
  }
  /** β = 2Z / (J (a - b) w). */
  step(): Rational {
    return { num: 2n * this.total, den: BigInt(this.levels) * (this.weights.high - this.weights.low) * BigInt(this.band) };
  }
  /** y_i = β (i - (N - 1)/2). */
  values(): Rational[] {
    const beta = this.step();
    return Array.from({ length: this.cells }, (_, i) => mul(beta, { num: BigInt(2 * i - (this.cells - 1)), den: 2n }));
  }
  weightsAt(level: number): bigint[] {
    return Array.from({ length: this.cells }, (_, i) => (level <= i && i < level + this.band ? this.weights.high : this.weights.low));
  }
  /** The cell of a uniform r below the total: the band's w cells of weight a first, then the others. */
  pick(level: number, r: bigint): number {
    const { high: a, low: b } = this.weights;
    const w = BigInt(this.band);
    if (r < w * a) return level + Number(r / a);
    const rest = Number((r - w * a) / b);
    return rest < level ? rest : rest + this.band;
  }
  sample(level: number, rng: RandomSource): number {
    return drawIndex(this.total, () => this.weightsAt(level), (r) => this.pick(level, r), rng);
  }
}

/** Wang et al.'s Piecewise Mechanism on N = J + w exact cell values. */
export class Piecewise extends NumericMechanism {
  readonly id: string = "piecewise";
  readonly grid: PiecewiseGrid;
  constructor(epsilon: Rational, range: NumericRange, params: Record<string, string> = {}, id = "piecewise") {
    const [levels, cells] = gridSize(id, epsilon, params);
    super(epsilon, range, levels);
    this.grid = new PiecewiseGrid(levels, cells, weightsFor(epsilon, 2 * cells));
    this.setTable(this.grid.values());
  }
  indexWeights(level: number): bigint[] {
    return this.grid.weightsAt(level);
  }
  protected sampleIndex(level: number, rng: RandomSource): number {
    return this.grid.sample(level, rng);
  }
  override thresholds(): Record<string, unknown> {
    return { levels: this.levels };
  }
}

/** Li et al.'s Square Wave: the piecewise law on cell centres (2i - (N - 1))/J. */
export class SquareWave extends Piecewise {
  override readonly id = "sw";
  constructor(epsilon: Rational, range: NumericRange, params: Record<string, string> = {}) {
    super(epsilon, range, params, "sw");
    const { cells, levels } = this.grid;
    this.setTable(Array.from({ length: cells }, (_, i) => ({ num: BigInt(2 * i - (cells - 1)), den: BigInt(levels) })));
  }
  override thresholds(): Record<string, unknown> {
    return { levels: this.levels, step: ratioText(this.grid.step()) };
  }
}

/** Wang et al.'s Hybrid: piecewise w.p. α, Duchi otherwise, on the same level. */
export class Hybrid extends NumericMechanism {
  readonly id = "hybrid";
  readonly grid: PiecewiseGrid;
  readonly duchiWeights: Weights;
  readonly B: Rational;
  readonly alphaWeight: bigint;
  constructor(epsilon: Rational, range: NumericRange, params: Record<string, string> = {}) {
    const [levels, cells] = gridSize("hybrid", epsilon, params);
    super(epsilon, range, levels);
    this.grid = new PiecewiseGrid(levels, cells, weightsFor(epsilon, 2 * cells));
    this.duchiWeights = weightsFor(epsilon, 2 * levels);
    this.B = duchiValue(this.duchiWeights);
    const full = 1n << BigInt(WEIGHT_BITS);
    this.alphaWeight = compare(epsilon, HYBRID_EPSILON_STAR) > 0
      ? full - 1n - expFloor({ num: -epsilon.num, den: 2n * epsilon.den }, full) : 0n;
    this.setTable(this.alphaWeight ? [...this.grid.values(), neg(this.B), this.B] : [neg(this.B), this.B]);
  }
  indexWeights(level: number): bigint[] {
    const duchi = duchiWeights(this.duchiWeights, this.levels, level);
    if (!this.alphaWeight) return duchi;
    const zDuchi = BigInt(this.levels) * (this.duchiWeights.high + this.duchiWeights.low);
    const rest = (1n << BigInt(WEIGHT_BITS)) - this.alphaWeight;
    return [...this.grid.weightsAt(level).map((w) => this.alphaWeight * zDuchi * w), ...duchi.map((w) => rest * this.grid.total * w)];
  }
  protected sampleIndex(level: number, rng: RandomSource): number {
    if (bernoulliRatio(this.alphaWeight, 1n << BigInt(WEIGHT_BITS), rng)) return this.grid.sample(level, rng);
    const [minus, plus] = duchiWeights(this.duchiWeights, this.levels, level);
    return (this.alphaWeight ? this.grid.cells : 0) + (bernoulliRatio(plus, minus + plus, rng) ? 1 : 0);
  }
  override thresholds(): Record<string, unknown> {
    return { levels: this.levels, B_exact: ratioText(this.B), alpha_weight: this.alphaWeight };
  }
}

