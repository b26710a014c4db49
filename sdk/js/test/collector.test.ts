// The SDK against a real `fedldp collector serve` (the repository's .venv), over gRPC:
// ledger charges exactly, same bytes and ids on retry (DUPLICATE, charged once),
// the on-device budget guard.
import { test } from "node:test";
import assert from "node:assert/strict";
import { copyFileSync, readFileSync } from "node:fs";
import * as path from "node:path";
import { BudgetExhaustedError } from "../src/client.js";
import { type ClientOptions, openClient } from "../src/node.js";
import { equal, parseDecimal } from "../src/exact.js";
import { fromHex } from "../src/policy.js";
import { ledgerWindows, makeDeployment, noCollector, removeDeployment, startCollector } from "./harness.js";

test("records, flushes and retries against a real collector; the ledger is charged exactly",
  { skip: noCollector },
  async () => {
    const { dir, fixture } = makeDeployment();
    const collector = await startCollector(dir, fixture);
    try {
      const options: ClientOptions = {
        collector: `127.0.0.1:${collector.grpcPort}`, token: fixture.token, insecure: true,
        pinnedRootKeys: fixture.pinned_root_keys.map(fromHex), rootEnvelope: fromHex(fixture.root_envelope),
        stateFile: path.join(dir, "device.json"), maxEpsilon: "2",
      };
      const metrics = fixture.metrics as Record<"grr" | "olh" | "oue", string>;
      let client = await openClient(options);
      for (const label of ["a", "b", "c"]) await client.record(metrics.grr, label);
      await client.record(metrics.olh, "d");
      await client.record(metrics.oue, "a");
      await assert.rejects(client.record(metrics.grr, "not-a-label"), (e: Error) => !e.message.includes("not-a-label"));
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
      await client.record(metrics.grr, "d");
      await assert.rejects(client.record(metrics.grr, "a"), BudgetExhaustedError);
      const last = await client.flush();
      assert.equal(last.accepted, 1);
      await client.close();

      const spent = ledgerWindows(fixture, "device-js");
      assert.equal(spent["js.grr"]?.reports, 4);
      assert.ok(equal(parseDecimal(spent["js.grr"]?.epsilon_spent ?? ""), parseDecimal("2")));
      assert.equal(spent["js.olh"]?.reports, 1);
      assert.ok(equal(parseDecimal(spent["js.olh"]?.epsilon_spent ?? ""), parseDecimal("1")));
      assert.ok(equal(parseDecimal(spent["js.oue"]?.epsilon_spent ?? ""), parseDecimal("0.75")));
      const state = readFileSync(options.stateFile, "utf8");
      assert.ok(!state.includes("not-a-label"));
    } finally {
      await collector.stop();
      removeDeployment(dir);
    }
  });
