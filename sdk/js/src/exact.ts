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
