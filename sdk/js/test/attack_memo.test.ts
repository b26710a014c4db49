// Attack on "no raw value is stored" (docs/sdk.md, TypeScript SDK) for memoized metrics.
// The TS client stores a memoized metric's MemoState as memo.py's to_json: permanent
// responses keyed by the value's index ({"responses":{"<index>":..}}), in the state file
// (Node) or IndexedDB (browsers). So the stored state names which labels the user has
// recorded, whatever the randomized responses say. The Python SDK keys its memo by an HMAC
// of the value under a device secret (docs/sdk.md, "The device state file").
import { test } from "node:test";
import assert from "node:assert/strict";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { FedldpClient } from "../src/client.js";
import { GetPoliciesResponseSchema } from "../src/gen/fedldp/v1/collector_pb.js";
import { SignedEnvelopeSchema } from "../src/gen/fedldp/v1/policy_pb.js";
import { TrustStore, verifyPolicy } from "../src/policy.js";
import { type CollectorMethod, type CollectorTransport } from "../src/transport.js";
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

/** The stored memo of a device that recorded label `which` of the memoized vector policy. */
async function storedMemo(which: number): Promise<string> {
  const vectors = load("policies.json");
  const c = vectors.cases.find((x: { name: string }) => x.name === "memoized, valid");
  const store = new MemoryStore();
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
  return Object.values(store.state?.memos ?? {})[0] ?? "";
}

test("the stored memo does not say which label was recorded", {
  todo: "finding: the TS state keys permanent responses by the value's index, so the state file / IndexedDB names the recorded labels",
}, async () => {
  const keys = (memo: string) => Object.keys((JSON.parse(memo) as { responses: object }).responses).sort();
  const first = keys(await storedMemo(1));
  const second = keys(await storedMemo(2));
  assert.deepEqual(first, second, `recording label 1 stores slots ${first}, label 2 stores ${second}`);
});
