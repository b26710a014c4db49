/**
 * Exact arithmetic: plain decimals, rationals, bracketed e^x and the 2^-53 grid.
 *
 * Every categorical threshold is numerator / 2^53 with numerator = floor (or ceil)
 * of formula(e^x) * 2^53, decided exactly as in the Python reference
 * (client/mechanisms/_common.py, dyadic_from_exp): e^x is bracketed between two
 * rationals, the monotone formula is evaluated at both ends, and the bracket is
 * narrowed until both ends round to the same integer.
 */

export const PROB_BITS = 53n;
export const PROB_ONE = 1n << PROB_BITS;

/** A rational num/den, den > 0 (not necessarily in lowest terms). */
export interface Rational {
  num: bigint;
  den: bigint;
}

const PLAIN_DECIMAL = /^(0|[1-9][0-9]*)(\.[0-9]+)?$/;

/** A plain non-negative decimal string ("0.5", "2") as an exact rational; throws otherwise. */
export function parseDecimal(text: string): Rational {
  if (!PLAIN_DECIMAL.test(text) || text.length > 40) {
    throw new Error("not a plain non-negative decimal");
  }
  const [whole, frac = ""] = text.split(".");
  return { num: BigInt((whole ?? "0") + frac), den: 10n ** BigInt(frac.length) };
}

/** A plain decimal with an optional leading minus ("-2.5"): a numeric range bound. */
export function parseSignedDecimal(text: string): Rational {
  if (text.startsWith("-")) {
    const x = parseDecimal(text.slice(1));
    return { num: -x.num, den: x.den };
  }
  return parseDecimal(text);
}

/** a/b compared with c/d: -1, 0 or 1. */
export function compare(a: Rational, b: Rational): number {
  const left = a.num * b.den;
  const right = b.num * a.den;
  return left < right ? -1 : left > right ? 1 : 0;
}

/** "num/den" (as in the conformance vectors) as a Rational. */
export function parseRational(text: string): Rational {
  const [num, den] = text.split("/");
  if (num === undefined || den === undefined) throw new Error("not a rational");
  return { num: BigInt(num), den: BigInt(den) };
}

export function equal(a: Rational, b: Rational): boolean {
  return a.num * b.den === b.num * a.den;
}

function floorDiv(a: bigint, b: bigint): bigint {
  const q = a / b;
  return (a % b !== 0n && (a < 0n) !== (b < 0n)) ? q - 1n : q;
}

function ceilDiv(a: bigint, b: bigint): bigint {
  return -floorDiv(-a, b);
}

/** Fixed-point bracket [lo, hi] / 2^bits of e^x, x = num/den >= 0. */
export function expBracket(x: Rational, bits: bigint): [bigint, bigint] {
  const one = 1n << bits;
  let r = 0n; // halve until y = x / 2^r <= 1/2
  while (2n * x.num > x.den << r) r += 1n;
  const yDen = x.den << r;
  const yLo = floorDiv(x.num << bits, yDen);
  const yHi = ceilDiv(x.num << bits, yDen);
  let termLo = one;
  let termHi = one;
  let lo = one;
  let hi = one;
  for (let i = 1n; termHi > 0n; i += 1n) {
    termLo = floorDiv(termLo * yLo, one * i);
    termHi = ceilDiv(termHi * yHi, one * i);
    lo += termLo;
    hi += termHi;
    if (termHi <= 1n) break;
  }
  hi += 2n; // the tail after the last term (y <= 1/2), rounded up
  for (let i = 0n; i < r; i += 1n) {
    lo = floorDiv(lo * lo, one);
    hi = ceilDiv(hi * hi, one);
  }
  return [lo, hi];
}

/** A formula monotone in e: maps e (as a rational) to a probability rational. */
export type Formula = (e: Rational) => Rational;

/** formula(e^x) rounded down (or up) to a multiple of 2^-53: its numerator. */
export function dyadicFromExp(formula: Formula, x: Rational, roundUp = false): bigint {
  for (let bits = 256n; bits <= 1n << 16n; bits *= 2n) {
    const [lo, hi] = expBracket(x, bits);
    const den = 1n << bits;
    const ends = [lo, hi].map((e) => {
      const f = formula({ num: e, den });
      const scaled = f.num * PROB_ONE;
      return roundUp ? ceilDiv(scaled, f.den) : floorDiv(scaled, f.den);
    });
    if (ends[0] === ends[1]) return ends[0] as bigint;
  }
  throw new Error("cannot round the probability: bracket did not narrow");
}

/** x / 2 exactly. */
export function half(x: Rational): Rational {
  return { num: x.num, den: x.den * 2n };
}

/** A Rational of num / 2^53. */
export function dyadic(numerator: bigint): Rational {
  return { num: numerator, den: PROB_ONE };
}

export function mul(a: Rational, b: Rational): Rational {
  return { num: a.num * b.num, den: a.den * b.den };
}

export function sub(a: Rational, b: Rational): Rational {
  return { num: a.num * b.den - b.num * a.den, den: a.den * b.den };
}

export function add(a: Rational, b: Rational): Rational {
  return { num: a.num * b.den + b.num * a.den, den: a.den * b.den };
}

export function div(a: Rational, b: Rational): Rational {
  return { num: a.num * b.den, den: a.den * b.num };
}

export const ONE: Rational = { num: 1n, den: 1n };
export const ZERO: Rational = { num: 0n, den: 1n };

export function int(n: bigint | number): Rational {
  return { num: BigInt(n), den: 1n };
}

/** "num/den" (the vectors' rational form). */
export function ratioText(x: Rational): string {
  return `${x.num}/${x.den}`;
}

/** A plain decimal string of a Rational whose denominator is a power of ten. */
export function decimalString(x: Rational): string {
  let scale = 0;
  let den = x.den;
  while (den > 1n && den % 10n === 0n) {
    den /= 10n;
    scale += 1;
  }
  if (den !== 1n) throw new Error("not a finite decimal");
  const digits = x.num.toString().padStart(scale + 1, "0");
  if (scale === 0) return digits;
  const text = `${digits.slice(0, -scale)}.${digits.slice(-scale)}`.replace(/0+$/, "");
  return text.endsWith(".") ? text.slice(0, -1) : text;
}

// ---------------------------------------------------------------------------
// Decimal rounding, ln, e^x floors and doubles: what the memoized charges
// (client/mechanisms/memo_loss.py) and the numeric grids (numeric.py) need.

export function floorOf(x: Rational): bigint {
  return floorDiv(x.num, x.den);
}

export function ceilOf(x: Rational): bigint {
  return ceilDiv(x.num, x.den);
}

function tenPow(n: number): Rational {
  return n >= 0 ? { num: 10n ** BigInt(n), den: 1n } : { num: 1n, den: 10n ** BigInt(-n) };
}

/** floor(log10 x) of a positive rational (Decimal's `adjusted()`). */
export function adjusted(x: Rational): number {
  let a = x.num.toString().length - x.den.toString().length;
  while (compare(x, tenPow(a)) < 0) a -= 1;
  while (compare(x, tenPow(a + 1)) >= 0) a += 1;
  return a;
}

export type Rounding = "floor" | "ceil" | "nearest";

function roundInteger(x: Rational, mode: Rounding): bigint {
  if (mode === "floor") return floorOf(x);
  if (mode === "ceil") return ceilOf(x);
  return floorDiv(2n * x.num + x.den, 2n * x.den); // ties up: never met (transcendental inputs)
}

/** x > 0 rounded to `digits` significant decimal digits (Decimal at that precision). */
export function roundSignificant(x: Rational, digits: number, mode: Rounding): Rational {
  const unit = tenPow(adjusted(x) - digits + 1);
  return mul(int(roundInteger(div(x, unit), mode)), unit);
}

/** x rounded at `places` decimal places (Decimal.quantize). */
export function roundPlaces(x: Rational, places: number, mode: Rounding): Rational {
  const unit = tenPow(-places);
  return mul(int(roundInteger(div(x, unit), mode)), unit);
}

/** One unit in the last of `digits` significant digits of x (x already has that many). */
function lastUnit(x: Rational, digits: number): Rational {
  return tenPow(adjusted(x) - digits + 1);
}

/** Decimal's next_plus at `digits` digits of a value already rounded to them. */
export function nextPlus(x: Rational, digits: number): Rational {
  return add(x, lastUnit(x, digits));
}

/** Decimal's next_minus at `digits` digits of a positive value already rounded to them. */
export function nextMinus(x: Rational, digits: number): Rational {
  const unit = lastUnit(x, digits);
  const power = equal(x, tenPow(adjusted(x))); // 10^a: the next lower value has a finer unit
  return sub(x, power ? div(unit, int(10)) : unit);
}

/** A fixed-point bracket [lo, hi] / 2^bits of a value known as v / 2^prec ± err / 2^prec. */
function narrowed(v: bigint, prec: bigint, err: bigint, bits: bigint): [bigint, bigint] {
  const shift = prec - bits;
  return [floorDiv(v - err, 1n << shift), ceilDiv(v + err, 1n << shift)];
}

/** 2 atanh(t) in fixed point (t = tn / 2^prec, 0 <= t < 1/2), each term floored. */
function twoAtanh(tn: bigint, prec: bigint): { value: bigint; terms: bigint } {
  const t2 = (tn * tn) >> prec;
  let power = tn;
  let sum = 0n;
  let terms = 0n;
  for (let i = 1n; power > 0n; i += 2n) {
    sum += power / i;
    power = (power * t2) >> prec;
    terms += 1n;
  }
  return { value: 2n * sum, terms };
}

/** Fixed-point bracket [lo, hi] / 2^bits of ln x, x > 0 (range reduction by 2, atanh series). */
export function lnBracket(x: Rational, bits: bigint): [bigint, bigint] {
  if (x.num <= 0n) throw new Error("ln needs x > 0");
  const prec = bits + 64n;
  let m = BigInt(x.num.toString(2).length - x.den.toString(2).length);
  const scaled = (e: bigint) => (e >= 0n ? { num: x.num, den: x.den << e } : { num: x.num << -e, den: x.den });
  while (compare(scaled(m), ONE) < 0) m -= 1n;
  while (compare(scaled(m), int(2)) >= 0) m += 1n;
  const y = scaled(m); // in [1, 2)
  const t = floorDiv((y.num - y.den) << prec, y.num + y.den); // (y - 1)/(y + 1) in [0, 1/3)
  const lnY = twoAtanh(t, prec);
  const ln2 = twoAtanh(floorDiv(1n << prec, 3n), prec);
  const absM = m < 0n ? -m : m;
  const value = lnY.value + m * ln2.value;
  // Floored products and terms: each series errs by at most (terms + 2)^2 units (generous).
  const err = 8n * (lnY.terms + 2n) ** 2n + 8n * (absM + 1n) * (ln2.terms + 2n) ** 2n;
  return narrowed(value, prec, err, bits);
}

function decide(bracket: (bits: bigint) => [bigint, bigint], round: (x: Rational) => Rational): Rational {
  for (let bits = 256n; bits <= 1n << 14n; bits *= 2n) {
    const [lo, hi] = bracket(bits);
    const den = 1n << bits;
    const a = round({ num: lo, den });
    const b = round({ num: hi, den });
    if (equal(a, b)) return a;
  }
  throw new Error("cannot round: bracket did not narrow");
}

/** memo_loss.ln_upper at 50 digits: the correctly rounded ln x, one unit up (x > 1). */
export function lnUpper(x: Rational, digits = 50): Rational {
  const nearest = decide((bits) => lnBracket(x, bits), (v) => roundSignificant(v, digits, "nearest"));
  return nextPlus(nearest, digits);
}

/** memo_loss.exp_lower at 50 digits: the correctly rounded e^x, one unit down (x > 0). */
export function expLower(x: Rational, digits = 50): Rational {
  const nearest = decide((bits) => expBracket(x, bits), (v) => roundSignificant(v, digits, "nearest"));
  return nextMinus(nearest, digits);
}

/** floor(e^x * m), exactly (x may be negative): numeric.exp_floor. */
export function expFloor(x: Rational, m: bigint): bigint {
  return roundExp(x, (e) => mul(e, int(m)), "floor");
}

/** formula(e^x) rounded to an integer (formula monotone in e near e^x; x may be negative). */
export function roundExp(x: Rational, formula: (e: Rational) => Rational, mode: Rounding): bigint {
  const negative = x.num < 0n;
  const absX = negative ? { num: -x.num, den: x.den } : x;
  const value = decide((bits) => {
    const [lo, hi] = expBracket(absX, bits);
    if (!negative) return [lo, hi];
    const one = 1n << (2n * bits);
    return [floorDiv(one, hi), ceilDiv(one, lo)]; // e^-x = 1 / e^x, still over 2^bits
  }, (e) => int(roundInteger(formula(e), mode)));
  return value.num;
}

const F64 = new DataView(new ArrayBuffer(8));

/** The exact rational of a finite double. */
export function fromDouble(value: number): Rational {
  if (!Number.isFinite(value)) throw new Error("not a finite double");
  F64.setFloat64(0, value);
  const bits = F64.getBigUint64(0);
  const sign = bits >> 63n ? -1n : 1n;
  const exponent = Number((bits >> 52n) & 0x7ffn);
  const fraction = bits & ((1n << 52n) - 1n);
  const mantissa = exponent === 0 ? fraction : fraction | (1n << 52n);
  const shift = BigInt((exponent === 0 ? 1 : exponent) - 1075);
  return shift >= 0n ? { num: sign * (mantissa << shift), den: 1n } : { num: sign * mantissa, den: 1n << -shift };
}

/** The correctly rounded (half-even) double of a rational (Python's float(Fraction)). */
export function toDouble(x: Rational): number {
  let { num, den } = x;
  if (den < 0n) { num = -num; den = -den; }
  if (num === 0n) return 0;
  const negative = num < 0n;
  if (negative) num = -num;
  let e = num.toString(2).length - den.toString(2).length; // 2^(e-1) <= roughly x < 2^(e+1)
  if (compare({ num, den }, e >= 0 ? int(1n << BigInt(e)) : { num: 1n, den: 1n << BigInt(-e) }) < 0) e -= 1;
  const shift = BigInt(52 - Math.max(e, -1022)); // 53 significant bits (fewer if subnormal)
  const scaledNum = shift >= 0n ? num << shift : num;
  const scaledDen = shift >= 0n ? den : den << -shift;
  let q = scaledNum / scaledDen;
  const r2 = 2n * (scaledNum % scaledDen);
  if (r2 > scaledDen || (r2 === scaledDen && (q & 1n) === 1n)) q += 1n;
  const value = Number(q) * 2 ** -Number(shift); // q < 2^54 is exact; the power of two is exact
  if (!Number.isFinite(value)) throw new Error("rational out of the double range");
  return negative ? -value : value;
}

/** The 16 hex digits of a double's big-endian bytes (as in the vectors). */
export function doubleHex(value: number): string {
  F64.setFloat64(0, value);
  return F64.getBigUint64(0).toString(16).padStart(16, "0");
}
