// record() of every kind of metric against a real `fedldp collector serve`: memoized
// categorical (rappor-grr, loloha: memo state persisted with the report, reused after a
// restart), numeric (hybrid, clipped), open-domain strings (pem, cms, hcms) and
// multi-attribute values (array or object). The collector accepts every report, the ledger
// charges exactly the policy's charge (max(ε1, ε_I) for the memoized ones), and no raw
// value appears in the state file (text, UTF-8 hex, double bits) or in any error.
import { test } from "node:test";
import assert from "node:assert/strict";
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { type ClientOptions, openClient } from "../src/node.js";
import { FileStore } from "../src/outbox_file.js";
import { doubleHex, equal, mul, int, parseDecimal } from "../src/exact.js";
import { fromHex, hex } from "../src/policy.js";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../../..");
const python = path.join(repo, ".venv/bin/python");
const fedldp = path.join(repo, ".venv/bin/fedldp");

async function portOf(file: string, proc: ChildProcess): Promise<string> {
  const deadline = Date.now() + 60_000;
  while (!existsSync(file)) {
    if (proc.exitCode !== null) throw new Error(`collector exited with ${proc.exitCode}`);
    if (Date.now() > deadline) throw new Error("collector did not start");
    await new Promise((r) => setTimeout(r, 100));
  }
  return readFileSync(file, "utf8").trim();
}

const RAW_STRINGS = ["zebra-label", "other-label", "third-label", "qzx!", "wq#x", "jkl%"];
const RAW_NUMBERS = [3.14159265, -12.5, 0.123456789, -0.987654321];
const HIDDEN = ["hidden-label-xyz", "toolong-secret", "notanumber-secret"];

function leaks(text: string): string[] {
  const found: string[] = [];
  const encoder = new TextEncoder();
  for (const s of [...RAW_STRINGS, ...HIDDEN]) {
    if (text.includes(s) || text.includes(hex(encoder.encode(s)))) found.push(s);
  }
  for (const x of RAW_NUMBERS) {
    const big = doubleHex(x);
    const little = big.match(/../g)!.reverse().join("");
    if (text.includes(String(x)) || text.includes(big) || text.includes(little)) found.push(String(x));
  }
  return found;
}

test("the leak scan finds a raw value written as text, UTF-8 hex or double bits", () => {
  assert.deepEqual(leaks('{"x":"qzx!"}'), ["qzx!"]);
  assert.deepEqual(leaks(hex(new TextEncoder().encode("wq#x"))), ["wq#x"]);
  assert.deepEqual(leaks(`0a${doubleHex(0.123456789).match(/../g)!.reverse().join("")}`), ["0.123456789"]);
});

test("record() takes every metric type, stores no raw value, and the ledger charges exactly",
  { skip: existsSync(fedldp) ? false : "no .venv/bin/fedldp: run make .venv/.test-installed" },
  async () => {
    const dir = mkdtempSync(path.join(tmpdir(), "fedldp-js-rec-"));
    const setup = spawnSync(python, [path.join(repo, "sdk/js/test/record_fixture.py"), dir], { encoding: "utf8" });
    assert.equal(setup.status, 0, setup.stderr);
    const fixture = JSON.parse(readFileSync(path.join(dir, "fixture.json"), "utf8"));
    const portFile = path.join(dir, "port");
    const collector = spawn(fedldp, ["collector", "serve", "--config", fixture.config, "--port-file", portFile],
      { stdio: ["ignore", "ignore", "inherit"] });
    try {
      const options: ClientOptions = {
        collector: `127.0.0.1:${await portOf(portFile, collector)}`, token: fixture.token, insecure: true,
        pinnedRootKeys: fixture.pinned_root_keys.map(fromHex), rootEnvelope: fromHex(fixture.root_envelope),
        stateFile: path.join(dir, "device.json"), maxEpsilon: "5",
      };
      let client = await openClient(options);
      const errors: string[] = [];
      const refused = async (metric: string, value: unknown) => {
        await assert.rejects(client.record(metric, value as string), (e: Error) => { errors.push(e.message); return true; });
      };
      for (const metric of ["metric.rec_rappor", "metric.rec_loloha"]) {
        await client.record(metric, "zebra-label");
        await client.record(metric, "zebra-label");
        await client.record(metric, "other-label");
        await refused(metric, "hidden-label-xyz");
        await refused(metric, 7);
      }
      await client.record("metric.rec_hybrid", 3.14159265);
      await client.record("metric.rec_hybrid", -12.5); // clipped to lo
      await refused("metric.rec_hybrid", Number.NaN);
      await refused("metric.rec_hybrid", "hidden-label-xyz");
      await client.record("metric.rec_pem", "qzx!");
      await client.record("metric.rec_cms", "wq#x");
      await client.record("metric.rec_hcms", "jkl%");
      await refused("metric.rec_pem", "toolong-secret");
      await refused("metric.rec_cms", "a\u0000b");
      await refused("metric.rec_hcms", "\uD800");
      await client.record("metric.rec_multi", ["third-label", 0.123456789]);
      await client.record("metric.rec_multi", { kind: "zebra-label", level: -0.987654321 });
      await refused("metric.rec_multi", ["zebra-label", "notanumber-secret"]);
      await refused("metric.rec_multi", ["hidden-label-xyz", 0.5]);
      assert.equal(errors.length, 11);
      assert.deepEqual(errors.flatMap(leaks), [], "an error message carries a raw value");
      const memos = (await new FileStore(options.stateFile).load())!.memoRows as Record<string, unknown>;
      assert.deepEqual(Object.keys(memos).sort(), ["metric.rec_loloha", "metric.rec_rappor"]);
      await client.close();

      // A restarted app keeps its permanent responses: the memo only grows.
      client = await openClient(options);
      await client.record("metric.rec_rappor", "zebra-label");
      const after = (await new FileStore(options.stateFile).load())!.memoRows as Record<string, unknown>;
      assert.deepEqual(after["metric.rec_rappor"], memos["metric.rec_rappor"]);
      const state = readFileSync(options.stateFile, "utf8");
      assert.deepEqual(leaks(state), [], "the state file carries a raw value");
      const sent = await client.flush();
      assert.deepEqual([sent.accepted, sent.refused, sent.pending], [14, 0, 0]);
      const charges = Object.fromEntries(["rappor", "loloha", "hybrid", "pem", "multi"].map(
        (m) => [`rec.${m}`, client.policy(`metric.rec_${m}`)!.charge]));
      await client.close();

      const show = spawnSync(fedldp, ["ledger", "show", "device-rec", "--config", fixture.config, "--json"], { encoding: "utf8" });
      assert.equal(show.status, 0, show.stderr);
      const windows = JSON.parse(show.stdout).windows as { policy_id: string; reports: number; epsilon_spent: string }[];
      const spent = Object.fromEntries(windows.map((w) => [w.policy_id, w]));
      assert.ok(equal(charges["rec.rappor"]!, parseDecimal("1.493812")));
      for (const [policy, reports] of [["rec.rappor", 4], ["rec.loloha", 3], ["rec.hybrid", 2], ["rec.pem", 1], ["rec.multi", 2]] as const) {
        assert.equal(spent[policy]?.reports, reports, policy);
        assert.ok(equal(parseDecimal(spent[policy]?.epsilon_spent ?? ""), mul(charges[policy]!, int(reports))), policy);
      }
    } finally {
      collector.kill("SIGTERM");
      await new Promise((r) => collector.once("exit", r));
      rmSync(dir, { recursive: true, force: true });
    }
  });
