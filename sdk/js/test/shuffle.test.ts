// The shuffle model end to end with the TS SDK: a policy with a [shuffle] section (the
// analyzer's X25519 key from `fedldp shuffler keygen`), the TS SDK records into a real
// `fedldp collector serve` over gRPC from Node, and from a headless Chromium page (the
// GRR/OLH bundle over Connect: the sealing chunk loaded lazily, WebCrypto's HKDF and
// @hpke's X25519 and ChaCha20-Poly1305 in the browser) — every stored and sent report carries only
// `Report.sealed` (no plain payload, no label in the state file or the wire bytes) — the
// collector accepts and charges them, and the Python roles read them: `fedldp shuffler
// pull` copies the window's ciphertexts, `release` shuffles the batch, `analyze` opens
// every ciphertext the TS SDK sealed (none dropped) and counts them. A page or app without
// shuffle policies never loads the HPKE code (sealed.ts imports it on the first seal).
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { fromBinary } from "@bufbuild/protobuf";
import { ReportSchema } from "../src/gen/fedldp/v1/collector_pb.js";
import { openClient } from "../src/node.js";
import { fromHex } from "../src/policy.js";
import { type Fixture, fedldp, ledgerWindows, noCollector, python, repo, startCollector } from "./harness.js";
import { launch, noChromium, runPage, servePage } from "./chromium.js";

interface ShuffleFixture {
  config: string; token: string; labels: string[]; metric: string; pinned_root_keys: string[]; root_envelope: string;
  policies: string; trust: string; analyzer_key: string; window: number;
}

function run(args: string[]): string {
  const done = spawnSync(fedldp, args, { encoding: "utf8" });
  assert.equal(done.status, 0, `fedldp ${args.slice(0, 2).join(" ")}: ${done.stderr}${done.stdout}`);
  return done.stdout;
}

test("TS-sealed reports go through the collector, the shuffler and the analyzer", { skip: noCollector || noChromium }, async () => {
  const dir = mkdtempSync(path.join(tmpdir(), "fedldp-js-shuffle-"));
  const { origin, server } = await servePage();
  const setup = spawnSync(python, [path.join(repo, "sdk/js/test/shuffle_fixture.py"), dir, origin], { encoding: "utf8" });
  assert.equal(setup.status, 0, setup.stderr);
  const f = JSON.parse(readFileSync(path.join(dir, "fixture.json"), "utf8")) as ShuffleFixture;
  const collector = await startCollector(dir, f as unknown as Fixture);
  const chromium = await launch();
  try {
    // A page records 6 values and flushes them after a reload (Connect, GRR/OLH bundle).
    const params = {
      bundle: "fedldp.grr-olh.min.js", protocol: "connect", collectorUrl: `http://127.0.0.1:${collector.webPort}`,
      token: f.token, pinnedRootKeys: f.pinned_root_keys, rootEnvelope: f.root_envelope, metric: f.metric, database: "db-shuffle",
    };
    const recorded = await runPage(chromium.page, origin, { ...params, mode: "record", labels: [...f.labels, ...f.labels.slice(0, 2)] });
    assert.deepEqual(recorded, { ok: true, pending: 6 });
    assert.ok(chromium.sent.some((s) => /\/chunks\/sealed-[A-Za-z0-9]+\.js$/.test(s.url)), "the page did not load the sealing chunk");
    const flushed = await runPage(chromium.page, origin, { ...params, mode: "flush" });
    assert.equal(flushed.ok, true, String(flushed.error));
    assert.equal((flushed.flushed as { accepted: number }).accepted, 6);
    for (const label of f.labels) {
      assert.ok(!String(flushed.state).includes(label), "IndexedDB holds a raw value");
      assert.ok(!chromium.sent.some((s) => Buffer.from(s.body).includes(Buffer.from(label))), "a request carried a raw value");
    }

    const stateFile = path.join(dir, "device.state");
    const client = await openClient({
      collector: `127.0.0.1:${collector.grpcPort}`, token: f.token, insecure: true, stateFile,
      pinnedRootKeys: f.pinned_root_keys.map(fromHex), rootEnvelope: fromHex(f.root_envelope),
    });
    assert.ok(client.policy(f.metric)?.analyzerPublicKey, "the policy's shuffle section was not read");
    const values = Array.from({ length: 24 }, (_, i) => f.labels[i % 3 === 0 ? 1 : 0]!);
    for (const value of values) await client.record(f.metric, value);
    const pending = client.pendingReports();
    assert.equal(pending.length, 24);
    for (const p of pending) {
      const report = fromBinary(ReportSchema, fromHex(p.report));
      assert.equal(report.payload.case, "sealed", "a report of a shuffle policy left unsealed");
      assert.equal(report.payload.value.ciphertext.length, 304); // one 256-byte block + HPKE's 48 bytes
    }
    const state = readFileSync(stateFile, "latin1");
    for (const label of f.labels) assert.ok(!state.includes(label), "the state file holds a raw value");
    const sent = await client.flush();
    assert.deepEqual([sent.accepted, sent.refused, sent.pending], [24, 0, 0]);
    await client.close();
    assert.equal(ledgerWindows(f as unknown as Fixture, "device-shuffle")["js.shuffle"]?.reports, 30);

    const spool = path.join(dir, "spool.sqlite");
    run(["shuffler", "pull", "--config", f.config, "--policy", "js.shuffle", "--window", String(f.window), "--spool", spool]);
    const batch = `js.shuffle.v1.${f.window}`;
    const released = run(["shuffler", "release", "--spool", spool, "--batch", batch, "--out", path.join(dir, "out"),
      "--policies", f.policies, "--trust", f.trust]);
    assert.match(released, /released 30 shuffled ciphertexts/);
    const analyzed = run(["shuffler", "analyze", path.join(dir, "out", `${batch}.shuffled`), "--analyzer-key", f.analyzer_key,
      "--policy", "js.shuffle", "--policies", f.policies, "--trust", f.trust]);
    assert.match(analyzed, /valid reports: 30; invalid dropped: none/);
  } finally {
    await chromium.close();
    await collector.stop();
    server.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
