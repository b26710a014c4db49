// Attack on the TypeScript SDK's trust (docs/sdk.md: "newer roots are applied in order (TUF
// rules)"). A root rotation that drops a compromised policy key must stay in force after the
// app restarts; otherwise a collector (or whoever serves GetPolicies) that withholds the newer
// roots from a restarted device gets policies signed by the revoked key accepted again. The
// Python SDK stores the trust it reached (tests/integration/test_sdk_fresh_start.py).
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import * as path from "node:path";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { FedldpClient } from "../src/client.js";
import { GetPoliciesResponseSchema } from "../src/gen/fedldp/v1/collector_pb.js";
import { SignedEnvelopeSchema } from "../src/gen/fedldp/v1/policy_pb.js";
import { type CollectorMethod, type CollectorTransport } from "../src/transport.js";
import { noCollector, python, repo } from "./harness.js";
import { MemoryStore } from "./attack_kit.js";
import { fromHex } from "./vectors.js";

/** GetPolicies answering `roots` and `policies` (hex envelopes). */
class Serving implements CollectorTransport {
  constructor(readonly roots: string[], readonly policies: string[]) {}
  async call(method: CollectorMethod): Promise<Uint8Array> {
    assert.equal(method, "GetPolicies");
    const envelope = (h: string) => fromBinary(SignedEnvelopeSchema, fromHex(h));
    return toBinary(GetPoliciesResponseSchema, create(GetPoliciesResponseSchema, {
      roots: this.roots.map(envelope), policies: this.policies.map(envelope),
    }));
  }
  close(): void {}
}

test("a root rotation revoking a policy key holds across a restart", {
  skip: noCollector,
  todo: "finding: the rotated root is not stored; a restarted device trusts root v1 again and accepts a policy signed by the revoked key",
}, async () => {
  const run = spawnSync(python, [path.join(repo, "sdk/js/test/attack_root_fixture.py")], { encoding: "utf8" });
  assert.equal(run.status, 0, run.stderr);
  const f = JSON.parse(run.stdout);
  const store = new MemoryStore();
  const options = {
    store, pinnedRootKeys: f.pinned_root_keys.map(fromHex), rootEnvelope: fromHex(f.root_v1),
    now: () => BigInt(f.now),
  };
  const first = await FedldpClient.open({ ...options, transport: new Serving([f.root_v2], [f.after_rotation]) });
  assert.equal(first.policy("metric.atk_root")?.version, 1n); // held: v2 root applied, P2 trusted
  await first.close();
  // Restart; the server withholds root v2 and offers version 2 signed by the revoked P1.
  const second = await FedldpClient.open({ ...options, transport: new Serving([], [f.revoked]) });
  const policy = second.policy("metric.atk_root");
  await second.close();
  assert.equal(policy, undefined, `accepted version ${policy?.version} signed by the revoked key`);
});
