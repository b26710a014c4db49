// Every mechanism this SDK randomizes against conformance/v1/mechanisms.json: thresholds,
// charges, the exact law of every output (categorical and memoized), and for the numeric
// grids the table, the index weights of every level, grid positions and sample laws.
import { test } from "node:test";
import assert from "node:assert/strict";
import { type Rational, equal, parseDecimal, parseRational, parseSignedDecimal, doubleHex } from "../src/exact.js";
import { NOT_YET, NumericMechanism, SUPPORTED } from "../src/mechanisms.js";
import { type Json, build, doubleOf, lawInput, load, outputOf } from "./vectors.js";

const cases: Json[] = load("mechanisms.json").cases;

function sameThreshold(expected: Json, got: unknown, where: string): void {
  if (typeof got === "object" && got !== null) {
    for (const [name, value] of Object.entries(got)) sameThreshold(expected[name], value, `${where}.${name}`);
    return;
  }
  if (typeof got === "string") {
    const asRational = (text: string) => (text.includes("/") ? parseRational(text) : parseSignedDecimal(text));
    assert.ok(equal(asRational(got), asRational(expected)), where);
    return;
  }
  assert.notEqual(expected, undefined, `${where}: not in the vector`);
  const want = typeof expected === "object" ? BigInt(expected.dyadic53) : BigInt(expected);
  assert.equal(BigInt(got as number | bigint), want, where);
}

test("every registered mechanism is either randomized here or listed as not yet", () => {
  const ids = new Set(cases.map((c) => c.mechanism as string));
  assert.deepEqual([...ids].sort(), [...SUPPORTED, ...NOT_YET].sort());
});

test("thresholds and charges equal the vectors (report_charge: ε, or max(ε1, ε_I) memoized)", () => {
  let checked = 0;
  for (const c of cases.filter((x) => (SUPPORTED as readonly string[]).includes(x.mechanism))) {
    const mechanism = build(c);
    const where = `${c.mechanism} ε=${c.epsilon} ${JSON.stringify(c.params)}`;
    sameThreshold(c.thresholds, mechanism.thresholds(), where);
    assert.ok(equal(mechanism.charge, parseDecimal(c.report_charge)), `${where} charge`);
    checked += 1;
  }
  assert.equal(checked, 55, `${checked} cases`);
});

test("categorical and memoized laws: every output's probability equals the vector's rational", () => {
  for (const c of cases.filter((x) => x.law !== undefined && (SUPPORTED as readonly string[]).includes(x.mechanism))) {
    const mechanism = build(c);
    for (const entry of c.law) {
      for (const [out, prob] of entry.outputs) {
        const got = mechanism.probability(lawInput(c, entry.value), outputOf(out));
        assert.ok(equal(got, parseRational(prob)), `${c.mechanism} ε=${c.epsilon} v=${entry.value}`);
      }
    }
  }
});

test("numeric grids: table doubles, index weights, grid positions and wire laws equal the vectors", () => {
  for (const c of cases.filter((x) => x.numeric !== undefined && (SUPPORTED as readonly string[]).includes(x.mechanism))) {
    const mechanism = build(c) as NumericMechanism;
    const where = `${c.mechanism} ε=${c.epsilon} ${JSON.stringify(c.params)}`;
    assert.equal(mechanism.levels, c.numeric.levels, where);
    assert.deepEqual(mechanism.table.map(doubleHex), c.numeric.table, where);
    c.numeric.weights.forEach((row: string[], level: number) => {
      assert.deepEqual(mechanism.indexWeights(level).map(String), row, `${where} level ${level}`);
    });
    for (const input of c.numeric.inputs) {
      const x = doubleOf(input.input_double);
      assert.equal(mechanism.gridPosition(mechanism.clip(x)[0]).toString(), input.grid_position, `${where} x=${x}`);
      const levels = mechanism.levelLaw(x);
      assert.equal(levels.length, input.level_law.length);
      levels.forEach(([j, p], i) => {
        assert.equal(j, input.level_law[i][0]);
        assert.ok(equal(p, parseRational(input.level_law[i][1])));
      });
      const distinct = new Set(mechanism.table.map(doubleHex));
      const listed = new Set(input.law.map((row: string[]) => row[0]));
      for (const bits of distinct) {
        const got = mechanism.probability(x, { kind: "numeric", value: doubleOf(bits) });
        const row = input.law.find((r: string[]) => r[0] === bits);
        if (row === undefined) assert.equal(got.num, 0n, `${where} x=${x} ${bits}`);
        else assert.ok(equal(got, parseRational(row[1])), `${where} x=${x} ${bits}`);
      }
      assert.ok([...listed].every((b) => distinct.has(b as string)));
    }
  }
});

test("sampled cases (multi-attribute): each sampled output's probability equals the vector's rational", () => {
  let checked = 0;
  for (const c of cases.filter((x) => x.samples !== undefined && (SUPPORTED as readonly string[]).includes(x.mechanism))) {
    const mechanism = build(c);
    for (const row of c.samples) {
      const got = mechanism.probability(row.value, outputOf(row.output));
      assert.ok(equal(got, parseRational(row.probability)), `${c.mechanism} ${JSON.stringify(row.output)}`);
      checked += 1;
    }
  }
  assert.ok(checked >= 60, `${checked} samples`);
});

test("memoized charges over the wider grid: max(ε1, ε_I), memo key and thresholds equal the vectors", () => {
  const charges: Json[] = load("mechanisms.json").charges;
  assert.equal(charges.length, 90);
  for (const c of charges) {
    const mechanism = build(c) as unknown as { charge: Rational; memoKey: string; thresholds(): Record<string, unknown> };
    const where = `${c.mechanism} ε1=${c.epsilon} ${JSON.stringify(c.params)} ${JSON.stringify(c.metric)}`;
    assert.ok(equal(mechanism.charge, parseDecimal(c.report_charge)), `${where}: ${c.report_charge}`);
    assert.equal(mechanism.memoKey, c.memo_key, where);
    sameThreshold(c.thresholds, mechanism.thresholds(), where);
  }
});

test("numeric grids derived from ε alone (default levels and cells) equal the vectors", () => {
  const grids: Json[] = load("mechanisms.json").grids;
  assert.equal(grids.length, 49);
  for (const c of grids) {
    const mechanism = build({ ...c, metric: { lo: "0", hi: "1" } }) as NumericMechanism;
    const where = `${c.mechanism} ε=${c.epsilon} ${JSON.stringify(c.params)}`;
    assert.equal(mechanism.levels, c.levels, where);
    assert.equal(mechanism.table.length, c.cells, where);
    const first = mechanism.indexWeights(0);
    assert.deepEqual([...new Set(first)].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0)).map(String), c.weight_values, where);
    assert.equal(first.reduce((a, b) => a + b, 0n).toString(), c.weight_total, where);
    sameThreshold(c.thresholds, mechanism.thresholds(), where);
  }
});
