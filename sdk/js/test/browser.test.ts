// Headless Chromium loads a page (served on 127.0.0.1) that records through the SDK's
// browser bundle into a real collector's web endpoint (cross-origin: CORS). Checked: the
// ledger's charges; the reports stay in IndexedDB across a page reload until flushed;
// the network log — every request body leaving the page, exact bytes — contains no raw
// value (the policy's labels are distinctive strings), only the two Collector RPCs go to
// the collector, and the stored state holds no raw value either.
import { test } from "node:test";
import assert from "node:assert/strict";
import { equal, parseDecimal } from "../src/exact.js";
import { launch, noChromium, runPage, servePage } from "./chromium.js";
import { ledgerWindows, makeDeployment, noCollector, removeDeployment, startCollector } from "./harness.js";

const skip = noCollector || noChromium;

/** True when `needle`'s UTF-8 (or UTF-16LE) bytes occur in `body`. */
function contains(body: Uint8Array, needle: string): boolean {
  const hay = Buffer.from(body);
  return hay.includes(Buffer.from(needle, "utf8")) || hay.includes(Buffer.from(needle, "utf16le"));
}

for (const [bundle, protocol] of [["fedldp.grr-olh.min.js", "connect"], ["fedldp.all.min.js", "grpc-web"]] as const) {
  test(`chromium, ${bundle} over ${protocol}: records into the collector; no raw value leaves the page`, { skip }, async () => {
    const { origin, server } = await servePage();
    const { dir, fixture } = makeDeployment([origin]);
    const collector = await startCollector(dir, fixture);
    const chromium = await launch();
    try {
      const labels = [...fixture.web_labels, ...fixture.web_labels, fixture.web_labels[0]!];
      const common = {
        bundle, protocol, collectorUrl: `http://127.0.0.1:${collector.webPort}`, token: fixture.web_token,
        pinnedRootKeys: fixture.pinned_root_keys, rootEnvelope: fixture.root_envelope,
        metric: fixture.metrics.web, database: "fedldp-test",
      };
      const recorded = await runPage(chromium.page, origin, { ...common, mode: "record", labels });
      assert.deepEqual(recorded, { ok: true, pending: labels.length });
      // A new page load (the app restarted): the outbox is still in IndexedDB; flush sends it.
      const flushed = await runPage(chromium.page, origin, { ...common, mode: "flush" });
      assert.equal(flushed.ok, true, String(flushed.error));
      const result = flushed.flushed as { accepted: number; duplicate: number; pending: number };
      assert.deepEqual([result.accepted, result.duplicate, result.pending], [labels.length, 0, 0]);

      const spent = ledgerWindows(fixture, "device-web");
      assert.equal(spent["js.web"]?.reports, labels.length);
      assert.ok(equal(parseDecimal(spent["js.web"]?.epsilon_spent ?? ""), parseDecimal("1.75")));

      const toCollector = chromium.sent.filter((s) => s.url.startsWith(common.collectorUrl));
      const rpcs = toCollector.filter((s) => s.method === "POST").map((s) => new URL(s.url).pathname);
      assert.ok(rpcs.includes("/fedldp.v1.Collector/Submit") && rpcs.includes("/fedldp.v1.Collector/GetPolicies"));
      for (const s of chromium.sent) {
        const where = s.url.startsWith(origin) ? "page" : s.url.startsWith(common.collectorUrl) ? "collector" : "elsewhere";
        assert.notEqual(where, "elsewhere", `a request left for ${s.url}`);
        if (where === "collector" && s.method !== "OPTIONS") {
          assert.match(new URL(s.url).pathname, /^\/fedldp\.v1\.Collector\/(Submit|GetPolicies)$/);
        }
        for (const label of fixture.web_labels) assert.ok(!contains(s.body, label), `${s.url} carried a raw value`);
      }
      const submitted = toCollector.filter((s) => s.method === "POST" && s.url.endsWith("/Submit"));
      assert.ok(submitted.length >= 1 && submitted.every((s) => s.body.length > 0), "Submit bodies were logged");
      const state = String(flushed.state);
      for (const label of fixture.web_labels) assert.ok(!state.includes(label), "the stored state holds a raw value");
    } finally {
      await chromium.close();
      await collector.stop();
      server.close();
      removeDeployment(dir);
    }
  });
}

test("chromium: a page from an origin not allowed is refused (CORS)", { skip }, async () => {
  const { origin, server } = await servePage();
  const { dir, fixture } = makeDeployment(["https://another.example"]);
  const collector = await startCollector(dir, fixture);
  const chromium = await launch();
  try {
    const result = await runPage(chromium.page, origin, {
      bundle: "fedldp.grr-olh.min.js", protocol: "connect", collectorUrl: `http://127.0.0.1:${collector.webPort}`,
      token: fixture.web_token, pinnedRootKeys: fixture.pinned_root_keys, rootEnvelope: fixture.root_envelope,
      metric: fixture.metrics.web, database: "fedldp-test", mode: "record", labels: [],
    });
    assert.equal(result.ok, false);
    assert.match(String(result.error), /unavailable|fetch/i);
    const rpcs = chromium.sent.filter((s) => s.method === "POST" && s.url.includes("/fedldp.v1.Collector/"));
    assert.ok(rpcs.length > 0 && rpcs.every((s) => s.corsError !== undefined),
      `every RPC was blocked by CORS: ${JSON.stringify(rpcs.map((s) => [s.url, s.corsError]))}`);
    assert.deepEqual(ledgerWindows(fixture, "device-web"), {});
  } finally {
    await chromium.close();
    await collector.stop();
    server.close();
    removeDeployment(dir);
  }
});
