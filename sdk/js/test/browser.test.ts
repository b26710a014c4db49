// Headless Chromium loads a page (served on 127.0.0.1) that records through the SDK's
// browser bundle into a real collector's web endpoint (cross-origin: CORS). One collector
// and one browser for every case. Checked: the ledger's charges; the reports stay in
// IndexedDB across a page reload until flushed; the network log — every request body
// leaving the page, exact bytes — contains no raw value (the policy's labels are
// distinctive strings; a page that leaks one is caught), only the two Collector RPCs go
// to the collector, the stored state holds no raw value; a page of another origin
// (localhost instead of 127.0.0.1) is blocked by CORS.
import { test } from "node:test";
import assert from "node:assert/strict";
import { equal, parseDecimal } from "../src/exact.js";
import { type Sent, launch, noChromium, runPage, servePage } from "./chromium.js";
import { ledgerWindows, makeDeployment, noCollector, removeDeployment, startCollector } from "./harness.js";

const skip = noCollector || noChromium;

/** True when `needle`'s UTF-8 or UTF-16LE bytes occur in `body`. */
function contains(body: Uint8Array, needle: string): boolean {
  const hay = Buffer.from(body);
  return hay.includes(Buffer.from(needle, "utf8")) || hay.includes(Buffer.from(needle, "utf16le"));
}

/** Every request in `sent` that carried one of `labels` in its URL or body. */
function leaks(sent: Sent[], labels: string[]): string[] {
  return sent.filter((s) => labels.some((l) => contains(s.body, l) || s.url.includes(encodeURIComponent(l)) || s.url.includes(l)))
    .map((s) => `${s.method} ${s.url}`);
}

test("chromium: pages record into the collector's web endpoint; no raw value leaves them", { skip }, async (t) => {
  const { origin, server } = await servePage();
  const otherOrigin = origin.replace("127.0.0.1", "localhost");
  const { dir, fixture } = makeDeployment([origin]);
  const collector = await startCollector(dir, fixture);
  const chromium = await launch();
  const collectorUrl = `http://127.0.0.1:${collector.webPort}`;
  const common = {
    collectorUrl, token: fixture.web_token, pinnedRootKeys: fixture.pinned_root_keys,
    rootEnvelope: fixture.root_envelope, metric: fixture.metrics.web,
  };
  const labels = [...fixture.web_labels, ...fixture.web_labels, fixture.web_labels[0]!];
  try {
    let charged = 0;
    for (const [bundle, protocol] of [["fedldp.grr-olh.min.js", "connect"], ["fedldp.all.min.js", "grpc-web"]] as const) {
      await t.test(`${bundle} over ${protocol}`, async () => {
        chromium.sent.length = 0;
        const params = { ...common, bundle, protocol, database: `db-${protocol}` };
        // The Connect page is left without close(): the reports come back from IndexedDB's change log alone.
        const recorded = await runPage(chromium.page, origin, { ...params, mode: "record", labels, noClose: protocol === "connect" });
        assert.deepEqual(recorded, { ok: true, pending: labels.length });
        // A new page load (the app restarted): the outbox is still in IndexedDB; flush sends it.
        const flushed = await runPage(chromium.page, origin, { ...params, mode: "flush" });
        assert.equal(flushed.ok, true, String(flushed.error));
        const result = flushed.flushed as { accepted: number; duplicate: number; pending: number };
        assert.deepEqual([result.accepted, result.duplicate, result.pending], [labels.length, 0, 0]);
        charged += labels.length;
        const spent = ledgerWindows(fixture, "device-web");
        assert.equal(spent["js.web"]?.reports, charged);
        assert.ok(equal(parseDecimal(spent["js.web"]?.epsilon_spent ?? ""), parseDecimal(String(charged * 0.25))));

        assert.deepEqual(leaks(chromium.sent, fixture.web_labels), []);
        for (const s of chromium.sent) {
          assert.ok(s.url.startsWith(origin) || s.url.startsWith(collectorUrl), `a request left for ${s.url}`);
          if (s.url.startsWith(collectorUrl) && s.method !== "OPTIONS") {
            assert.match(new URL(s.url).pathname, /^\/fedldp\.v1\.Collector\/(Submit|GetPolicies)$/);
            assert.equal(s.corsError, undefined);
          }
        }
        // No shuffle-model policy here: the sealing chunk (HPKE) is never fetched.
        assert.ok(!chromium.sent.some((s) => s.url.includes("/chunks/sealed-")), "a page without shuffle policies loaded the sealing code");
        const submitted = chromium.sent.filter((s) => s.method === "POST" && s.url.endsWith("/Submit"));
        assert.ok(submitted.length >= 1 && submitted.every((s) => s.body.length > 0), "Submit bodies were logged");
        const state = String(flushed.state);
        for (const label of fixture.web_labels) assert.ok(!state.includes(label), "the stored state holds a raw value");
      });
    }

    await t.test("IndexedDB outbox: 300 records (past the 128-change compaction), no close(), a reload: all pending, each sent once", async () => {
      const params = { ...common, bundle: "fedldp.grr-olh.min.js", protocol: "connect", database: "db-many" };
      const labels = Array.from({ length: 300 }, (_, i) => fixture.web_labels[i % fixture.web_labels.length]!);
      const before = ledgerWindows(fixture, "device-web")["js.web"]?.reports ?? 0;
      const recorded = await runPage(chromium.page, origin, { ...params, mode: "record", labels, noClose: true }, 120_000);
      assert.deepEqual(recorded, { ok: true, pending: 300 });
      const flushed = await runPage(chromium.page, origin, { ...params, mode: "flush" }, 120_000);
      assert.equal(flushed.ok, true, String(flushed.error));
      const result = flushed.flushed as { accepted: number; duplicate: number; pending: number };
      assert.deepEqual([result.accepted, result.duplicate, result.pending], [300, 0, 0]);
      assert.equal(ledgerWindows(fixture, "device-web")["js.web"]?.reports, before + 300);
    });

    await t.test("a version-1 database (the earlier layout) is upgraded and its reports sent", async () => {
      const result = await runPage(chromium.page, origin, {
        ...common, bundle: "fedldp.grr-olh.min.js", protocol: "connect", database: "db-legacy", mode: "legacy",
        labels: fixture.web_labels,
      });
      assert.equal(result.ok, true, String(result.error));
      assert.equal(result.pending, fixture.web_labels.length);
      assert.equal((result.flushed as { accepted: number }).accepted, fixture.web_labels.length);
    });

    await t.test("the network check catches a page that leaks a raw value (broken variant)", async () => {
      chromium.sent.length = 0;
      const leaked = await runPage(chromium.page, origin, { ...common, bundle: "fedldp.grr-olh.min.js", mode: "leak", label: fixture.web_labels[1] });
      assert.equal(leaked.ok, true, String(leaked.error));
      assert.equal(leaks(chromium.sent, fixture.web_labels).length, 1);
    });

    await t.test("an error answer reaches the page with gRPC's code (both bundles, binary-only protobuf)", async () => {
      // The bundles carry no protobuf JSON codec: the Connect error body (JSON) and gRPC-Web's
      // trailers must still become a TransportError with the code.
      for (const [bundle, protocol] of [["fedldp.grr-olh.min.js", "connect"], ["fedldp.all.min.js", "grpc-web"]] as const) {
        const result = await runPage(chromium.page, origin, {
          ...common, token: "not-a-token", bundle, protocol, database: `db-badtoken-${protocol}`, mode: "record", labels: [],
        });
        assert.equal(result.ok, false, `${bundle}: a bad token was accepted`);
        assert.equal(result.code, "UNAUTHENTICATED", `${bundle} over ${protocol}: ${String(result.error)}`);
        assert.match(String(result.error), /^TransportError: /);
      }
    });

    await t.test("a page of an origin not allowed is blocked by CORS", async () => {
      chromium.sent.length = 0;
      const before = ledgerWindows(fixture, "device-web");
      const result = await runPage(chromium.page, otherOrigin, {
        ...common, bundle: "fedldp.grr-olh.min.js", protocol: "connect", database: "db-other", mode: "record", labels: [fixture.web_labels[0]],
      });
      assert.equal(result.ok, false);
      assert.match(String(result.error), /unavailable|fetch/i);
      const rpcs = chromium.sent.filter((s) => s.method === "POST" && s.url.includes("/fedldp.v1.Collector/"));
      assert.ok(rpcs.length > 0 && rpcs.every((s) => s.corsError !== undefined),
        `every RPC was blocked by CORS: ${JSON.stringify(rpcs.map((s) => [s.url, s.corsError]))}`);
      assert.deepEqual(ledgerWindows(fixture, "device-web"), before);
    });
  } finally {
    await chromium.close();
    await collector.stop();
    server.close();
    removeDeployment(dir);
  }
});
