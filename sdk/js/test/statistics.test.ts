// The statistical tests of the TypeScript randomizers (issue #31, item 4):
// (a) the exact law: each randomizer is run down every branch of its draws by an enumerating
//     source (test/law.ts) and the probability of every output must equal the vector's
//     rational exactly; the primitives themselves are checked at the word level (thresholds
//     counted at their boundaries, small bounds enumerated);
// (b) sampling with the real CSPRNG: Pearson's chi-square against the exact law at
//     α = 1e-6 (a correct randomizer fails with probability at most 1e-6 per test run);
//     broken variants, sampled from a fixed-seed source, must be rejected.
import { test } from "node:test";
import assert from "node:assert/strict";
import { type Rational, dyadic, equal, parseDecimal, parseRational, parseSignedDecimal, doubleHex, ONE, sub } from "../src/exact.js";
import {
  CMS, Duchi, GRR, type Input, PEM, pemHash, prefixChunks, type Mechanism, MemoState, type Output, Piecewise, RapporGRR, SUPPORTED,
} from "../src/mechanisms.js";
import { type RandomSource, below, bernoulli, systemRandom } from "../src/random.js";
import { chiSquare, enumerateLaw, seededSource, setFixedBytes } from "./law.js";
import { type Json, build, fromHex, doubleOf, lawInput, load, outputOf } from "./vectors.js";

const ALPHA = 1e-6;
const cases: Json[] = load("mechanisms.json").cases.filter((c: Json) => (SUPPORTED as readonly string[]).includes(c.mechanism));

function keyOf(out: Output): string {
  switch (out.kind) {
    case "category": return `c${out.index}`;
    case "bits": return `b${out.length}:${Array.from(out.bits, (b) => b.toString(16).padStart(2, "0")).join("")}`;
    case "hashed": return `h${out.seed}:${out.value}`;
    case "numeric": return `n${doubleHex(out.value)}`;
    case "index_bits": return `i${out.indices.join(",")}:${Array.from(out.bits).join(",")}`;
    case "sketch_row": return `r${out.row}:${Array.from(out.bits).join(",")}`;
    case "sketch_bit": return `s${out.row}:${out.column}:${out.bit}`;
    case "group_hashed": return `g${out.group}:${Array.from(out.key).join(",")}:${out.value}`;
    default: return `m[${out.parts.map((p) => `${p.attribute}=${keyOf(p.output)}`).join(";")}]`;
  }
}

/** One report of `value`; a memoized mechanism starts from an empty memo (the first report's law). */
function once(mechanism: Mechanism, value: Input, rng: RandomSource): Output {
  return mechanism.perturb(value, rng, mechanism.newMemo?.());
}

function sameLaw(got: Map<string, Rational>, want: Map<string, Rational>, where: string): void {
  assert.deepEqual([...got.keys()].sort(), [...want.keys()].sort(), `${where}: support`);
  for (const [k, p] of want) assert.ok(equal(got.get(k) as Rational, p), `${where}: P[${k}]`);
}

function vectorLaws(c: Json): Array<{ value: number; law: Map<string, Rational> }> {
  if (c.law !== undefined) {
    return c.law.map((entry: Json) => ({
      value: lawInput(c, entry.value),
      law: new Map(entry.outputs.map(([out, p]: [Json, string]) => [keyOf(outputOf(out)), parseRational(p)])),
    }));
  }
  return c.numeric.inputs.map((input: Json) => ({
    value: doubleOf(input.input_double),
    law: new Map(input.law.map(([bits, p]: [string, string]) => [`n${bits}`, parseRational(p)])),
  }));
}

test("(a) every randomizer, run down every branch of its draws, realizes the vectors' law exactly", () => {
  let laws = 0;
  for (const c of cases.filter((x) => x.samples === undefined)) {
    const mechanism = build(c);
    for (const { value, law } of vectorLaws(c)) {
      sameLaw(enumerateLaw((rng) => once(mechanism, value, rng), keyOf), law, `${c.mechanism} ε=${c.epsilon} v=${value}`);
      laws += 1;
    }
  }
  assert.ok(laws >= 150, `${laws} laws`);
});

test("(a) sampled cases: the enumerated law gives each vector sample its probability and sums to 1", () => {
  // cms's 16-column rows have 2^16 flip patterns per row: its enumeration runs on a 4-column
  // sketch below, against `probability` (which the vectors pin in mechanisms.test.ts).
  for (const c of cases.filter((x) => x.samples !== undefined && x.mechanism !== "cms")) {
    const mechanism = build(c);
    const laws = new Map<string, Map<string, Rational>>();
    for (const row of c.mechanism === "pem" ? c.samples.slice(0, 4) : c.samples) { // pem: one enumeration per key
      let name = JSON.stringify(row.value);
      if (c.mechanism === "pem") { // the key is drawn uniformly: enumerate given the sample's key
        setFixedBytes(() => fromHex(row.output.key));
        name += row.output.key;
      }
      if (!laws.has(name)) laws.set(name, enumerateLaw((rng) => once(mechanism, row.value, rng), keyOf));
      const law = laws.get(name) as Map<string, Rational>;
      assert.ok(equal(law.get(keyOf(outputOf(row.output))) as Rational, parseRational(row.probability)), c.mechanism);
      let total: Rational = { num: 0n, den: 1n };
      for (const p of law.values()) total = { num: total.num * p.den + p.num * total.den, den: total.den * p.den };
      const keyMass = c.mechanism === "pem" ? { num: 1n, den: 1n << BigInt(4 * row.output.key.length) } : ONE;
      assert.ok(equal(total, keyMass), `${c.mechanism}: the law sums to 1 (pem: given the key, its probability)`);
    }
  }
});

/** GRR whose truth probability is one threshold step (2^-53) too high. */
class OneStepGRR extends GRR {
  constructor(epsilon: Rational, k: number) {
    super(epsilon, k);
    (this as { keep: bigint }).keep = this.keep + 1n;
  }
}

/** rappor-grr whose instantaneous keep is one threshold step (2^-53) too high. */
class OneStepRappor extends RapporGRR {
  constructor() {
    super(parseDecimal("1"), 3, parseDecimal("2"));
    (this as { keepR: bigint }).keepR = this.keepR + 1n;
  }
}

/** duchi whose grid position is one 2^-64 step off. */
class OneStepDuchi extends Duchi {
  override gridPosition(clipped: number): bigint {
    return super.gridPosition(clipped) + 1n;
  }
}

test("(a) one-step variants of a memoized and a numeric randomizer are rejected by the exact-law comparison", () => {
  const rappor = cases.find((x) => x.mechanism === "rappor-grr" && x.metric.k === 3);
  const [first] = vectorLaws(rappor);
  const memoBroken = new OneStepRappor();
  const got = enumerateLaw((rng) => once(memoBroken, first!.value, rng), keyOf);
  assert.throws(() => sameLaw(got, first!.law, "one-step rappor-grr"), assert.AssertionError);
  const duchi = cases.find((x) => x.mechanism === "duchi" && x.epsilon === "1");
  const [atLo] = vectorLaws(duchi); // input lo: grid position 0
  const numericBroken = new OneStepDuchi(parseDecimal("1"), { lo: parseSignedDecimal("-1"), hi: parseDecimal("1") });
  const law = enumerateLaw((rng) => numericBroken.perturb(atLo!.value as number, rng), keyOf);
  assert.throws(() => sameLaw(law, atLo!.law, "one-step duchi"), assert.AssertionError);
});

test("(a) a small cms, run down every branch, realizes `probability` for every output", () => {
  const cms = new CMS(parseDecimal("2"), { maxBytes: 4 }, { rows: "2", columns: "4" });
  for (const value of ["a", "ab", "zz"]) {
    const law = enumerateLaw((rng) => cms.perturb(value, rng), keyOf);
    assert.equal(law.size, 2 * 16);
    for (let row = 0; row < 2; row += 1) {
      for (let bits = 0; bits < 16; bits += 1) {
        const out: Output = { kind: "sketch_row", row, bits: Uint8Array.of(bits), length: 4 };
        assert.ok(equal(law.get(keyOf(out)) as Rational, cms.probability(value, out)), `${value} ${row} ${bits}`);
      }
    }
  }
});

test("(a) a GRR one threshold step (2^-53) off is rejected by the exact-law comparison", () => {
  const c = cases.find((x) => x.mechanism === "grr" && x.metric.k === 4 && x.epsilon === "1");
  const broken = new OneStepGRR(parseDecimal("1"), 4);
  const [first] = vectorLaws(c);
  const got = enumerateLaw((rng) => broken.perturb(first!.value, rng), keyOf);
  assert.throws(() => sameLaw(got, first!.law, "one-step GRR"), assert.AssertionError);
});

test("(a) memo slots: a second report reuses the value's stored permanent response", () => {
  for (const id of ["rappor-grr", "rappor-oue", "rappor-sue"]) {
    const c = cases.find((x) => x.mechanism === id && x.metric.k === 3);
    const mechanism = build(c) as RapporGRR;
    const bytesKey = (b: Uint8Array) => Array.from(b).join(",");
    const twice = enumerateLaw((rng) => {
      const memo = mechanism.newMemo();
      const first = mechanism.perturb(1, rng, memo);
      const second = mechanism.perturb(1, rng, memo);
      assert.deepEqual([...memo.responses.keys()], [1]);
      return [first, second, memo.responses.get(1) as Uint8Array] as const;
    }, ([a, b, z]) => `${keyOf(a)}|${keyOf(b)}|${bytesKey(z)}`);
    // P[y1, y2, z] = perm(z) inst(y1 | z) inst(y2 | z): the permanent law and each z's
    // instantaneous law enumerated on their own.
    const permanent = enumerateLaw((rng) => {
      const memo = mechanism.newMemo();
      mechanism.perturb(1, rng, memo);
      return memo.responses.get(1) as Uint8Array;
    }, bytesKey);
    const instant = new Map([...permanent.keys()].map((z) => [z, enumerateLaw(
      (rng) => mechanism.perturb(1, rng, memoWith(mechanism, 1, Uint8Array.from(z.split(",").map(Number)))), keyOf)]));
    for (const [k, p] of twice) {
      const [ya, yb, z] = k.split("|") as [string, string, string];
      const inst = instant.get(z) as Map<string, Rational>;
      const [pz, pa, pb] = [permanent.get(z), inst.get(ya), inst.get(yb)] as Rational[];
      assert.ok(equal(p, { num: pz!.num * pa!.num * pb!.num, den: pz!.den * pa!.den * pb!.den }), `${id}: P[${k}]`);
    }
    assert.ok(twice.size > permanent.size);
  }
});

test("(a) memo state from the vectors: same key and layout; the next report's law, enumerated, equals the file's", () => {
  let checked = 0;
  for (const c of cases.filter((x) => x.memo !== undefined)) {
    const mechanism = build(c) as RapporGRR;
    assert.equal(mechanism.memoKey, c.memo.key, c.mechanism);
    assert.equal(MemoState.fromJSON(c.memo.state).toJSON(), c.memo.state);
    for (const entry of c.memo.instant) {
      const want = new Map<string, Rational>(entry.law.map(([out, p]: [Json, string]) => [keyOf(outputOf(out)), parseRational(p)]));
      const got = enumerateLaw((rng) => {
        const memo = MemoState.fromJSON(c.memo.state);
        const out = mechanism.perturb(entry.value, rng, memo);
        assert.equal(memo.toJSON(), c.memo.state, "a stored slot was redrawn");
        return out;
      }, keyOf);
      sameLaw(got, want, `${c.mechanism} memo v=${entry.value}`);
      checked += 1;
    }
  }
  assert.equal(checked, 30);
});

function memoWith(mechanism: Mechanism, value: number, response: Uint8Array): MemoState {
  const memo = mechanism.newMemo!();
  memo.responses.set(value, response);
  return memo;
}

test("(a) primitives at the word level: bernoulli's threshold and below's rejection, counted exactly", () => {
  const words = (...values: number[]): RandomSource => {
    let i = 0;
    return { fill(array: Uint32Array) { for (let j = 0; j < array.length; j += 1) array[j] = values[i++] as number; } };
  };
  const u53 = (u: bigint): number[] => [Number(u >> 32n) << 11, Number(u & 0xffffffffn)];
  for (const numerator of [0n, 1n, 5189199575106477n, (1n << 53n) - 1n, 1n << 53n]) {
    // u < numerator is monotone in u: true at numerator - 1 and false at numerator means
    // exactly `numerator` of the 2^53 values of u give true.
    if (numerator > 0n) assert.equal(bernoulli(numerator, words(...u53(numerator - 1n))), true);
    if (numerator < 1n << 53n) assert.equal(bernoulli(numerator, words(...u53(numerator))), false);
  }
  for (const n of [1n, 2n, 3n, 5n, 6n, 7n, 8n]) { // every word value of the masked bits
    const bits = n.toString(2).length;
    const seen = new Map<bigint, number>();
    for (let x = 0; x < 1 << bits; x += 1) {
      const sentinel = 0;
      const got = below(n, words(x, sentinel));
      if (BigInt(x) < n) seen.set(got, (seen.get(got) ?? 0) + 1);
      else assert.equal(got, 0n, "a rejected draw is redrawn");
    }
    assert.deepEqual([...seen.keys()].sort(), Array.from({ length: Number(n) }, (_, i) => BigInt(i)));
    assert.ok([...seen.values()].every((count) => count === 1));
  }
  const big = (1n << 40n) + 3n; // two words; the top word is masked to 9 bits
  assert.equal(below(big, words(Number((big - 1n) >> 32n), Number((big - 1n) & 0xffffffffn))), big - 1n);
  assert.equal(below(big, words(Number(big >> 32n), Number(big & 0xffffffffn), 0, 7)), 7n);
});

test("(a) the piecewise cell picker maps exactly W(i | j) uniform values to cell i", () => {
  for (const c of cases.filter((x) => ["piecewise", "sw", "hybrid"].includes(x.mechanism))) {
    const grid = (build(c) as Piecewise).grid;
    for (let level = 0; level <= grid.levels; level += 1) {
      // Cells in the picker's order (the band first, then the others), each an interval of
      // r; the picker is a floor division inside the band and outside it, so it is monotone
      // on each interval and the two ends deciding it means every r inside does too.
      const order = [...Array.from({ length: grid.band }, (_, i) => level + i),
        ...Array.from({ length: grid.cells }, (_, i) => i).filter((i) => i < level || i >= level + grid.band)];
      const weights = grid.weightsAt(level);
      let start = 0n;
      for (const cell of order) {
        const end = start + (weights[cell] as bigint);
        assert.equal(grid.pick(level, start), cell);
        assert.equal(grid.pick(level, end - 1n), cell);
        start = end;
      }
      assert.equal(start, grid.total);
    }
  }
});

/** PEM's report as (group, offset of the reported hash from the prefix's hash mod g). */
function pemOutcome(pem: PEM, value: string): (out: Output) => string {
  return (out) => {
    if (out.kind !== "group_hashed") return "wrong kind";
    const hashed = pemHash(out.key, prefixChunks(pem.pad(value), pem.prefixBits(out.group)), pem.hashBits);
    return `${out.group}:${(out.value - hashed + pem.g) % pem.g}`;
  };
}

/** n reports of `value` from `rng`, counted by output. */
function sample(mechanism: Mechanism, value: Input, n: number, rng: RandomSource, outcome = keyOf): Map<string, number> {
  const counts = new Map<string, number>();
  for (let i = 0; i < n; i += 1) {
    const key = outcome(once(mechanism, value, rng));
    counts.set(key, (counts.get(key) ?? 0) + 1);
  }
  return counts;
}

const SAMPLES = 6000; // broken-variant tests (fixed seeds)
const SWEEP_SAMPLES = 3000; // the CSPRNG sweep over every mechanism

test(`(b) CSPRNG samples of every mechanism pass chi-square against the exact law (α = ${ALPHA} in all)`, () => {
  const each = ALPHA / SUPPORTED.length; // Bonferroni: the whole test fails a correct SDK w.p. <= ALPHA
  for (const id of SUPPORTED) {
    const c = cases.find((x) => x.mechanism === id);
    // cms: a 4-column sketch (2^16 flip patterns per row would be slow to enumerate)
    const mechanism = id === "cms" ? new CMS(parseDecimal("2"), { maxBytes: 4 }, { rows: "2", columns: "4" }) : build(c);
    const value = c.law !== undefined ? lawInput(c, c.law[c.law.length - 1].value)
      : c.numeric !== undefined ? doubleOf(c.numeric.inputs[3].input_double) : c.samples[0].value;
    // pem's key is uniform on 2^(8·key bytes) values: count (group, (y - h_key(prefix)) mod g),
    // whose law does not depend on the key (enumerated under the fixed one).
    const outcome = id === "pem" ? pemOutcome(mechanism as PEM, value as string) : keyOf;
    const law = enumerateLaw((rng) => once(mechanism, value, rng), outcome);
    const result = chiSquare(sample(mechanism, value, SWEEP_SAMPLES, systemRandom, outcome), law, SWEEP_SAMPLES);
    assert.ok(result.p >= each, `${id}: χ² = ${result.stat.toFixed(1)} on ${result.df} d.o.f., p = ${result.p}`);
  }
});

/** GRR whose truth probability is 5 points too high (a plausible bug: the keep of another ε). */
class BiasedGRR extends GRR {
  constructor(epsilon: Rational, k: number) {
    super(epsilon, k);
    (this as { keep: bigint }).keep = this.keep + (1n << 53n) / 20n;
  }
}

/** Piecewise whose high band starts one cell late (an off-by-one in the picker). */
class ShiftedPiecewise extends Piecewise {
  override perturb(value: number, rng: RandomSource = systemRandom): Output {
    const [low] = this.levelLaw(value)[0]!;
    const cell = this.grid.pick(Math.min(low + 1, this.levels), below(this.grid.total, rng));
    return { kind: "numeric", value: this.table[cell] as number };
  }
}

test("(b) broken variants sampled from a fixed seed are rejected (p < 1e-6); the honest ones from the same seed are not", () => {
  const grr = new GRR(parseDecimal("1"), 4);
  const lawGrr = enumerateLaw((rng) => grr.perturb(2, rng), keyOf);
  const honest = chiSquare(sample(grr, 2, SAMPLES, seededSource(7n)), lawGrr, SAMPLES);
  const biased = chiSquare(sample(new BiasedGRR(parseDecimal("1"), 4), 2, SAMPLES, seededSource(7n)), lawGrr, SAMPLES);
  assert.ok(honest.p >= ALPHA, `honest GRR p = ${honest.p}`);
  assert.ok(biased.p < ALPHA, `biased GRR p = ${biased.p}`);
  const range = { lo: parseDecimal("0"), hi: parseDecimal("10") };
  const pw = new Piecewise(parseDecimal("2"), range, { levels: "8" });
  const shifted = new ShiftedPiecewise(parseDecimal("2"), range, { levels: "8" });
  const lawPw = enumerateLaw((rng) => pw.perturb(5, rng), keyOf);
  assert.ok(chiSquare(sample(pw, 5, SAMPLES, seededSource(11n)), lawPw, SAMPLES).p >= ALPHA);
  const bad = chiSquare(sample(shifted, 5, SAMPLES, seededSource(11n)), lawPw, SAMPLES);
  assert.ok(bad.p < ALPHA, `shifted piecewise p = ${bad.p}`);
});

test("the truth's probability under the one-step variant differs from GRR's by exactly 2^-53", () => {
  const grr = new GRR(parseDecimal("1"), 4);
  const broken = new OneStepGRR(parseDecimal("1"), 4);
  const diff = sub(broken.probability(0, { kind: "category", index: 0 }), grr.probability(0, { kind: "category", index: 0 }));
  assert.ok(equal(diff, dyadic(1n)));
  assert.ok(!equal(diff, ONE));
});
