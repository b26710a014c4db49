// The SDK against a real `fedldp collector serve` (the repository's .venv), over gRPC:
// ledger charges exactly, same bytes and ids on retry (DUPLICATE, charged once),
// the on-device budget guard.
import { test } from "node:test";
import assert from "node:assert/strict";
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, copyFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { BudgetExhaustedError } from "../src/client.js";
import { type ClientOptions, openClient } from "../src/node.js";
import { equal, parseDecimal } from "../src/exact.js";
import { fromHex } from "../src/policy.js";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../../..");
const python = path.join(repo, ".venv/bin/python");
const fedldp = path.join(repo, ".venv/bin/fedldp");

async function waitFor(file: string, proc: ChildProcess, seconds: number): Promise<string> {
  const deadline = Date.now() + seconds * 1000;
  while (!existsSync(file)) {
    if (proc.exitCode !== null) throw new Error(`collector exited with ${proc.exitCode}`);
    if (Date.now() > deadline) throw new Error("collector did not start");
    await new Promise((r) => setTimeout(r, 100));
  }
  return readFileSync(file, "utf8").trim();
}

test("records, flushes and retries against a real collector; the ledger is charged exactly",
  { skip: existsSync(fedldp) ? false : "no .venv/bin/fedldp: run make .venv/.test-installed" },
  async () => {
    const dir = mkdtempSync(path.join(tmpdir(), "fedldp-js-"));
    const setup = spawnSync(python, [path.join(repo, "sdk/js/test/collector_fixture.py"), dir], { encoding: "utf8" });
    assert.equal(setup.status, 0, setup.stderr);
    const fixture = JSON.parse(readFileSync(path.join(dir, "fixture.json"), "utf8"));
    const portFile = path.join(dir, "port");
    const collector = spawn(fedldp, ["collector", "serve", "--config", fixture.config, "--port-file", portFile],
      { stdio: ["ignore", "ignore", "inherit"] });
    try {
      const port = await waitFor(portFile, collector, 60);
      const options: ClientOptions = {
        collector: `127.0.0.1:${port}`, token: fixture.token, insecure: true,
        pinnedRootKeys: fixture.pinned_root_keys.map(fromHex), rootEnvelope: fromHex(fixture.root_envelope),
        stateFile: path.join(dir, "device.json"), maxEpsilon: "2",
      };
      let client = await openClient(options);
      for (const label of ["a", "b", "c"]) await client.record(fixture.metrics.grr, label);
      await client.record(fixture.metrics.olh, "d");
      await client.record(fixture.metrics.oue, "a");
      await assert.rejects(client.record(fixture.metrics.grr, "not-a-label"), (e: Error) => !e.message.includes("not-a-label"));
      const before = client.pendingReports();
      assert.equal(before.length, 5);
      await client.close();

      // A restarted app resends exactly the stored bytes.
      copyFileSync(options.stateFile, path.join(dir, "device.before-flush.json"));
      client = await openClient(options);
      assert.deepEqual(client.pendingReports(), before);
      const first = await client.flush();
      assert.deepEqual([first.accepted, first.duplicate, first.pending], [5, 0, 0]);
      await client.close();

      // The collector committed but the answer was lost: the same bytes again are DUPLICATE.
      copyFileSync(path.join(dir, "device.before-flush.json"), options.stateFile);
      client = await openClient(options);
      const retry = await client.flush();
      assert.deepEqual([retry.accepted, retry.duplicate, retry.pending], [0, 5, 0]);

      // The budget guard: 0.5 per report, cap 2 -> the 5th grr report is refused on the device.
      await client.record(fixture.metrics.grr, "d");
      await assert.rejects(client.record(fixture.metrics.grr, "a"), BudgetExhaustedError);
      const last = await client.flush();
      assert.equal(last.accepted, 1);
      await client.close();

      const show = spawnSync(fedldp, ["ledger", "show", "device-js", "--config", fixture.config, "--json"], { encoding: "utf8" });
      assert.equal(show.status, 0, show.stderr);
      const windows = JSON.parse(show.stdout).windows as { policy_id: string; reports: number; epsilon_spent: string }[];
      const spent = Object.fromEntries(windows.map((w) => [w.policy_id, w]));
      assert.equal(spent["js.grr"]?.reports, 4);
      assert.ok(equal(parseDecimal(spent["js.grr"]?.epsilon_spent ?? ""), parseDecimal("2")));
      assert.equal(spent["js.olh"]?.reports, 1);
      assert.ok(equal(parseDecimal(spent["js.olh"]?.epsilon_spent ?? ""), parseDecimal("1")));
      assert.ok(equal(parseDecimal(spent["js.oue"]?.epsilon_spent ?? ""), parseDecimal("0.75")));
      const state = readFileSync(options.stateFile, "utf8");
      assert.ok(!state.includes("not-a-label"));
    } finally {
      collector.kill("SIGTERM");
      await new Promise((r) => collector.once("exit", r));
      rmSync(dir, { recursive: true, force: true });
    }
  });
