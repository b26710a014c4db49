// Attack on the TypeScript SDK's retry pacing (docs/sdk.md: flush() "pauses for the
// collector's retry-after-ms hint (else exponential backoff)"). A collector, or anything
// between the device and it, that answers every Submit RESOURCE_EXHAUSTED with
// `retry-after-ms: 0` must not turn flush() into an unbounded loop of calls: the Python
// SDK floors the hint (tests/client/sdk/test_sdk_gate.py, "hint floor and cap").
import { test } from "node:test";
import assert from "node:assert/strict";
import { FedldpClient } from "../src/client.js";
import { emptyState } from "../src/outbox.js";
import { type CollectorMethod, type CollectorTransport, TransportError } from "../src/transport.js";
import { MemoryStore } from "./attack_kit.js";
import { fromHex, load } from "./vectors.js";

/** A collector answering every Submit with RESOURCE_EXHAUSTED and the hint `hintMs`,
 * until `limit` calls (then a 60 s hint, so a looping flush ends and the count shows). */
class HintingCollector implements CollectorTransport {
  submits = 0;
  constructor(readonly hintMs: number, readonly limit: number) {}
  async call(method: CollectorMethod, _request: Uint8Array): Promise<Uint8Array> {
    if (method === "GetPolicies") return new Uint8Array(0); // no roots, no policies
    this.submits += 1;
    throw new TransportError("busy", "RESOURCE_EXHAUSTED", this.submits >= this.limit ? 60_000 : this.hintMs);
  }
  close(): void {}
}

async function flushAgainst(hintMs: number, paused: number[] = [], wakeAndFlush = false): Promise<number> {
  const trust = load("policies.json").trust;
  const state = emptyState();
  state.pending.push({ id: "00".repeat(16), report: "0a1000000000000000000000000000000000" });
  const collector = new HintingCollector(hintMs, 1000);
  const client = await FedldpClient.open({
    store: new MemoryStore(state), transport: collector,
    pinnedRootKeys: trust.pinned_root_keys.map(fromHex), rootEnvelope: fromHex(trust.root_envelope),
    now: () => BigInt(trust.trusted_at),
  });
  const result = await client.flush();
  assert.equal(result.pending, 1);
  paused.push(result.pausedMs);
  if (wakeAndFlush) {
    client.wake(); // connectivity came back: ends the backoff, not the server's hint
    paused.push((await client.flush()).pausedMs);
  }
  return collector.submits;
}

test("a retry hint of 250 ms pauses flush after one call (held)", async () => {
  assert.equal(await flushAgainst(250), 1);
});

test("a retry hint of 0 ms does not make flush() call in a loop", async () => {
  for (const hint of [0, 1, 5]) {
    const calls = await flushAgainst(hint);
    assert.equal(calls, 1, `hint ${hint} ms: one flush() made ${calls} Submit calls`);
  }
});

test("the hint is a floor on the jittered backoff and is capped at 3600 s (client/transport.py Backoff.delay)", async () => {
  const paused: number[] = [];
  await flushAgainst(10_000, paused);
  await flushAgainst(10_000_000, paused);
  await flushAgainst(0, paused);
  const [hinted, capped, zero] = paused as [number, number, number];
  assert.ok(hinted > 9_000 && hinted <= 10_000, `hint 10 s paused ${hinted} ms`);
  assert.ok(capped > 3_599_000 && capped <= 3_600_000, `hint 10^4 s paused ${capped} ms`);
  assert.ok(zero >= 0 && zero <= 500, `hint 0 paused ${zero} ms (first failure: uniform(0, 500 ms))`);
});

test("wake() ends the backoff but not a server hint still in force", async () => {
  const paused: number[] = [];
  assert.equal(await flushAgainst(10_000, paused, true), 1, "wake() let flush() call through a 10 s hint");
  assert.ok(paused[1]! > 9_000, `after wake() the pause left is ${paused[1]} ms`);
});
