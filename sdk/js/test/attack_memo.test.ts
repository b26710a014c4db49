// Attack on "no raw value is stored" (docs/sdk.md, TypeScript SDK) for memoized metrics.
// The TS client stores a memoized metric's MemoState as memo.py's to_json: permanent
// responses keyed by the value's index ({"responses":{"<index>":..}}), in the state file
// (Node) or IndexedDB (browsers). So the stored state names which labels the user has
// recorded, whatever the randomized responses say. The Python SDK keys its memo by an HMAC
// of the value under a device secret (docs/sdk.md, "The device state file"); the fixed TS
// client does the same (memo_store.ts), checked here against node:crypto and a vector
// computed with Python's hmac module.
import { createHmac } from "node:crypto";
import { test } from "node:test";
import assert from "node:assert/strict";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { FedldpClient } from "../src/client.js";
import { GetPoliciesResponseSchema } from "../src/gen/fedldp/v1/collector_pb.js";
import { SignedEnvelopeSchema } from "../src/gen/fedldp/v1/policy_pb.js";
import { TrustStore, verifyPolicy } from "../src/policy.js";
import { type CollectorMethod, type CollectorTransport } from "../src/transport.js";
import { hmacSha256, memoSlotKey } from "../src/memo_store.js";
import { type State } from "../src/outbox.js";
import { MemoryStore } from "./attack_kit.js";
import { fromHex, load } from "./vectors.js";

class Serving implements CollectorTransport {
  constructor(readonly envelope: string) {}
  async call(method: CollectorMethod): Promise<Uint8Array> {
    assert.equal(method, "GetPolicies");
    return toBinary(GetPoliciesResponseSchema, create(GetPoliciesResponseSchema, {
      policies: [fromBinary(SignedEnvelopeSchema, fromHex(this.envelope))],
    }));
  }
  close(): void {}
}

/** The stored state of a device (`store`, fresh by default) after it recorded label `which` of the memoized vector policy. */
async function recorded(which: number, store = new MemoryStore()): Promise<{ state: State; metric: string; memoKey: string }> {
  const vectors = load("policies.json");
  const c = vectors.cases.find((x: { name: string }) => x.name === "memoized, valid");
  const client = await FedldpClient.open({
    store, transport: new Serving(c.envelope), now: () => BigInt(c.now),
    pinnedRootKeys: vectors.trust.pinned_root_keys.map(fromHex), rootEnvelope: fromHex(vectors.trust.root_envelope),
  });
  const trust = await TrustStore.fromPinnedRoot(fromHex(vectors.trust.root_envelope), vectors.trust.pinned_root_keys.map(fromHex));
  const { metricName } = await verifyPolicy(fromHex(c.envelope), trust, { now: BigInt(c.now) });
  const policy = client.policy(metricName);
  assert.ok(policy, "the memoized vector policy verifies");
  await client.record(policy.metricName, policy.labels[which]!);
  await client.close();
  return { state: structuredClone(store.state!), metric: metricName, memoKey: policy.mechanism.newMemo!().key };
}

/** device_store.py memo_key, computed with node:crypto: HMAC-SHA256(secret, metric 0x00 slot-int32-be). */
function pythonMemoKey(secretHex: string, metric: string, slot: number): string {
  const slotBytes = Buffer.alloc(4);
  slotBytes.writeInt32BE(slot);
  return createHmac("sha256", Buffer.from(secretHex, "hex"))
    .update(Buffer.concat([Buffer.from(metric, "utf8"), Buffer.from([0]), slotBytes])).digest("hex");
}

test("the stored memo does not say which label was recorded: slots are keyed by HMAC under a per-device secret", async () => {
  for (const which of [1, 2]) {
    const { state, metric, memoKey } = await recorded(which);
    assert.equal(state.memos, undefined, "the index-keyed memo layout is still stored");
    assert.match(state.memoSecret ?? "", /^[0-9a-f]{64}$/);
    const stored = Object.keys(state.memoRows?.[metric]?.[memoKey] ?? {});
    assert.deepEqual(stored, [pythonMemoKey(state.memoSecret!, metric, which)], `label ${which}: slot not keyed as the Python SDK keys it`);
    // Without the secret the key matches no candidate slot (unkeyed, or keyed by another secret).
    const other = "00".repeat(32);
    for (let slot = -1; slot < 8; slot += 1) assert.notEqual(stored[0], pythonMemoKey(other, metric, slot));
  }
  // Two devices recording the same label store unrelated keys (the secret is per install).
  const [a, b] = [await recorded(1), await recorded(1)];
  assert.notEqual(a.state.memoSecret, b.state.memoSecret);
  assert.notDeepEqual(a.state.memoRows, b.state.memoRows);
});

test("a restarted device reuses its keyed permanent response, and re-keys the earlier index layout", async () => {
  const store = new MemoryStore();
  const first = await recorded(1, store);
  const again = await recorded(1, store);
  assert.deepEqual(again.state.memoRows, first.state.memoRows, "a permanent response was redrawn after restart");
  assert.equal(again.state.memoSecret, first.state.memoSecret, "the memo secret changed");
  // A state written by the earlier client (index keys) is re-keyed at open, response kept.
  const response = Object.values(first.state.memoRows![first.metric]![first.memoKey]!)[0]!;
  const legacy: State = { ...structuredClone(first.state), memoRows: undefined, memoSecret: undefined,
    memos: { [first.metric]: `{"key":${JSON.stringify(first.memoKey)},"responses":{"1":"${response}"}}` } };
  const migrated = await recorded(1, new MemoryStore(legacy));
  assert.equal(migrated.state.memos, undefined);
  assert.deepEqual(migrated.state.memoRows, {
    [first.metric]: { [first.memoKey]: { [pythonMemoKey(migrated.state.memoSecret!, first.metric, 1)]: response } },
  });
});

test("hmacSha256 and memoSlotKey match Python's hmac (device_store.py memo_key) and RFC 4231", () => {
  const secret = Array.from({ length: 32 }, (_, i) => i.toString(16).padStart(2, "0")).join("");
  // python3 -c "import hmac,hashlib; print(hmac.new(bytes(range(32)), b'metric.x\0'+s.to_bytes(4,'big',signed=True), hashlib.sha256).hexdigest())"
  assert.equal(memoSlotKey(secret, "metric.x", 1), "184fe06b054d9e626235a9efa441f486074c643ed0785f4f9ae3a2a559176bab");
  assert.equal(memoSlotKey(secret, "metric.x", -1), "7b669e8e13ba6f2b45c13c0e40de2c76720a301413e8ae269f2e4768c6e0525b");
  // RFC 4231 test case 6: a key longer than the block is hashed first.
  const long = hmacSha256(new Uint8Array(131).fill(0xaa), new TextEncoder().encode("Test Using Larger Than Block-Size Key - Hash Key First"));
  assert.equal(Buffer.from(long).toString("hex"), "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
});
