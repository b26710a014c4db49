// `fedldp demo --web` end to end: the demo starts its collector and page and prints the
// page's URL; headless Chromium opens it and clicks three choices; each is recorded,
// sent, and accepted; no request body carries a choice's label; after Ctrl-C the demo
// prints the ledger's count.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { launch, noChromium } from "./chromium.js";
import { fedldp, noCollector } from "./harness.js";

test("fedldp demo --web: the printed page records into the demo collector", { skip: noCollector || noChromium }, async () => {
  const out = path.join(mkdtempSync(path.join(tmpdir(), "fedldp-demo-web-")), "demo");
  const demo = spawn(fedldp, ["demo", "--web", "--out", out], { stdio: ["ignore", "pipe", "inherit"] });
  let stdout = "";
  demo.stdout.setEncoding("utf8");
  demo.stdout.on("data", (chunk: string) => { stdout += chunk; });
  const exited = new Promise<number | null>((resolve) => demo.once("exit", resolve));
  const chromium = await launch();
  try {
    const deadline = Date.now() + 90_000;
    while (!/demo page: (\S+)/.test(stdout)) {
      assert.ok(Date.now() < deadline && demo.exitCode === null, `the demo did not print its page: ${stdout}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    const url = /demo page: (\S+)/.exec(stdout)![1]!;
    await chromium.page.goto(url);
    await chromium.page.waitForFunction("window.fedldpDemo?.ready === true", { timeout: 60_000 });
    const labels = await chromium.page.$$eval("#choices button", (bs) => bs.map((b) => (b as HTMLElement).dataset.label ?? ""));
    assert.equal(labels.length, 8);
    for (const [i, label] of labels.slice(0, 3).entries()) {
      await chromium.page.click(`#choices button[data-label="${label}"]`);
      await chromium.page.waitForFunction(`window.fedldpDemo.sent === ${i + 1}`, { timeout: 30_000 })
        .catch(async (error: Error) => {
          throw new Error(`${error.message}; the page says: ${await chromium.page.$eval("#log", (e) => e.textContent)}`);
        });
    }
    for (const s of chromium.sent) {
      for (const label of labels) assert.ok(!Buffer.from(s.body).includes(Buffer.from(label)), `${s.url} carried a label`);
    }
    demo.kill("SIGINT");
    assert.equal(await exited, 0);
    assert.match(stdout, /reports in the ledger: 3\b/);
  } finally {
    await chromium.close();
    if (demo.exitCode === null) demo.kill("SIGKILL");
    rmSync(path.dirname(out), { recursive: true, force: true });
  }
});
