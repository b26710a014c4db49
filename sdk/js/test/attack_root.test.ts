// Attack on the TypeScript SDK's trust (docs/sdk.md: "newer roots are applied in order (TUF
// rules)"). A root rotation that drops a compromised policy key must stay in force after the
// app restarts; otherwise a collector (or whoever serves GetPolicies) that withholds the newer
// roots from a restarted device gets policies signed by the revoked key accepted again. The
// Python SDK stores the trust it reached (tests/integration/test_sdk_fresh_start.py); the TS
// client stores the highest verified root in its state (state.trust), checked here with the
// in-memory store and the real state file (IndexedDB keeps the same State object).
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
import { mkdtempSync, rmSync } from "node:fs";
import * as os from "node:os";
import { FileStore } from "../src/outbox_file.js";
import { type StateStore } from "../src/outbox.js";
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

interface Fixture { pinned_root_keys: string[]; root_v1: string; root_v2: string; after_rotation: string; revoked: string; now: number }

function fixture(): Fixture {
  const run = spawnSync(python, [path.join(repo, "sdk/js/test/attack_root_fixture.py")], { encoding: "utf8" });
  assert.equal(run.status, 0, run.stderr);
  return JSON.parse(run.stdout);
}

/** Open with root v2 served, close, then reopen with `store2` (the same store by default) offered the revoked key's policy. */
async function rotateThenRestart(f: Fixture, store: StateStore, store2: StateStore = store, pinned = f.pinned_root_keys) {
  const options = { pinnedRootKeys: pinned.map(fromHex), rootEnvelope: fromHex(f.root_v1), now: () => BigInt(f.now) };
  const first = await FedldpClient.open({ ...options, store, transport: new Serving([f.root_v2], [f.after_rotation]) });
  assert.equal(first.policy("metric.atk_root")?.version, 1n); // held: v2 root applied, P2 trusted
  await first.close();
  // Restart; the server withholds root v2 and offers version 2 signed by the revoked P1.
  const second = await FedldpClient.open({ ...options, store: store2, transport: new Serving([], [f.revoked]) });
  const policy = second.policy("metric.atk_root");
  await second.close();
  return policy;
}

test("a root rotation revoking a policy key holds across a restart (memory store and state file)", { skip: noCollector }, async () => {
  const f = fixture();
  const policy = await rotateThenRestart(f, new MemoryStore());
  assert.equal(policy, undefined, `accepted version ${policy?.version} signed by the revoked key`);
  const dir = mkdtempSync(path.join(os.tmpdir(), "fedldp-root-"));
  try {
    const file = path.join(dir, "device.json");
    const fromFile = await rotateThenRestart(f, new FileStore(file), new FileStore(file));
    assert.equal(fromFile, undefined, `state file: accepted version ${fromFile?.version} signed by the revoked key`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("stored trust is used only when valid and under the same pins", { skip: noCollector }, async () => {
  const f = fixture();
  // A tampered stored root (its own signatures fail) is ignored: the configured root v1 is used.
  const store = new MemoryStore();
  const tamper: StateStore = {
    load: async () => {
      const state = await store.load();
      if (state?.trust) state.trust.root = state.trust.root.slice(0, -2) + (state.trust.root.endsWith("00") ? "01" : "00");
      return state;
    },
    save: (state) => store.save(state),
    close: () => undefined,
  };
  const tampered = await rotateThenRestart(f, store, tamper);
  assert.equal(tampered?.version, 2n, "a tampered stored root was trusted");
  // Other pins (an app update re-provisioning trust): the stored root is not used.
  const other = new MemoryStore();
  await rotateThenRestart(f, other);
  assert.ok(other.state?.trust);
  other.state!.trust!.pinned = ["00".repeat(32)];
  const options = { pinnedRootKeys: f.pinned_root_keys.map(fromHex), rootEnvelope: fromHex(f.root_v1), now: () => BigInt(f.now) };
  const reprovisioned = await FedldpClient.open({ ...options, store: other, transport: new Serving([], [f.revoked]) });
  assert.equal(reprovisioned.policy("metric.atk_root")?.version, 2n, "trust stored under other pins was used");
  await reprovisioned.close();
});
