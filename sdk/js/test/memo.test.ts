// Memo state attacked: corrupt slots, foreign keys and malformed JSON are refused with a
// ValueError that carries no content, and nothing is drawn or stored on a refusal.
import { test } from "node:test";
import assert from "node:assert/strict";
import { parseDecimal } from "../src/exact.js";
import { DBitFlip, Loloha, MemoState, RapporGRR, RapporSUE, ValueError, createMechanism } from "../src/mechanisms.js";

const one = parseDecimal("1");
const two = parseDecimal("2");

test("a memoized mechanism needs its own memo: none, or another key, is refused", () => {
  const grr = new RapporGRR(one, 3, two);
  assert.throws(() => grr.perturb(0), ValueError);
  const other = new RapporGRR(parseDecimal("0.5"), 3, two).newMemo();
  assert.throws(() => grr.perturb(0, undefined, other), ValueError);
  assert.equal(other.responses.size, 0);
});

test("corrupt permanent responses and seeds are refused, not redrawn", () => {
  const cases: Array<[{ newMemo(): MemoState; perturb(v: number, r?: undefined, m?: MemoState): unknown }, number, number, Uint8Array]> = [
    [new RapporGRR(one, 3, two), 1, 1, Uint8Array.of(3, 0, 0, 0)], // index 3 outside [0, 3)
    [new RapporGRR(one, 3, two), 1, 1, Uint8Array.of(1, 0)], // wrong length
    [new RapporSUE(one, 3, two), 0, 0, Uint8Array.of(0x08)], // padding bit set
    [new Loloha(one, 4, two, 3), 0, -1, Uint8Array.of(255, 255, 255, 255, 255, 255, 255, 127)], // seed outside g^(m+1)
    [new DBitFlip(one, { lo: parseDecimal("0"), hi: parseDecimal("10") }, 4, two, 2), 1, -1, Uint8Array.of(3, 0, 0, 0, 1, 0, 0, 0)], // not increasing
  ];
  for (const [mechanism, value, slot, bytes] of cases) {
    const memo = mechanism.newMemo();
    memo.responses.set(slot, bytes);
    const before = memo.toJSON();
    assert.throws(() => mechanism.perturb(value, undefined, memo), (e: Error) => e instanceof ValueError && e.message.includes("corrupt"));
    assert.equal(memo.toJSON(), before);
  }
});

test("MemoState JSON: round trip, and malformed text refused without echoing it", () => {
  const memo = new MemoState("k", new Map([[-1, Uint8Array.of(1, 2)], [10, Uint8Array.of(255)], [2, Uint8Array.of()]]));
  assert.equal(memo.toJSON(), '{"key":"k","responses":{"-1":"0102","10":"ff","2":""}}');
  assert.equal(MemoState.fromJSON(memo.toJSON()).toJSON(), memo.toJSON());
  for (const bad of ["secret-text", '{"key":1,"responses":{}}', '{"key":"k","responses":{"x":"00"}}', '{"key":"k","responses":{"1":"0g"}}', '{"key":"k","responses":{"-2":"00"}}']) {
    assert.throws(() => MemoState.fromJSON(bad), (e: Error) => e instanceof ValueError && !e.message.includes("secret"));
  }
});

test("memoized policies are refused when ε1 > ε∞ or epsilon_permanent is missing", () => {
  assert.throws(() => createMechanism("rappor-grr", two, 3, { epsilon_permanent: "1" }), ValueError);
  assert.throws(() => createMechanism("rappor-oue", one, 3, {}), ValueError);
  assert.throws(() => createMechanism("rappor-sue", one, 3, { epsilon_permanent: "1" }), ValueError); // ε1 = ε∞: f = 0
  assert.throws(() => createMechanism("loloha", one, 3, { epsilon_permanent: "x" }), ValueError);
});
