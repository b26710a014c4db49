// Headless Chromium (Debian's /usr/bin/chromium, no browser download) driven over the
// Chrome DevTools Protocol with puppeteer-core, and a static server for the test page.
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import * as path from "node:path";
import puppeteer, { type Browser, type Page } from "puppeteer-core";
import { repo } from "./harness.js";

export const CHROMIUM = process.env.FEDLDP_CHROMIUM ?? "/usr/bin/chromium";
/** Why the browser tests cannot run here, or false. */
export const noChromium: string | false = existsSync(CHROMIUM)
  ? false : `no Chromium at ${CHROMIUM} (apt-get install chromium): browser test skipped`;

export const FLAGS = [
  "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
];

const js = path.join(repo, "sdk/js");
const FILES: Record<string, [string, string]> = {
  "/index.html": [path.join(js, "test/browser/index.html"), "text/html"],
  "/page.mjs": [path.join(js, "test/browser/page.mjs"), "text/javascript"],
  "/fedldp.all.min.js": [path.join(js, "dist/browser/fedldp.all.min.js"), "text/javascript"],
  "/fedldp.grr-olh.min.js": [path.join(js, "dist/browser/fedldp.grr-olh.min.js"), "text/javascript"],
};

/** Serve the test page and the bundles on 127.0.0.1 (port 0); resolves with its origin. */
export async function servePage(): Promise<{ origin: string; server: Server }> {
  const server = createServer((req, res) => {
    const url = (req.url ?? "").split("?")[0] ?? "";
    // The bundles' lazy chunks (dist/browser/chunks/, plain names only).
    const chunk = /^\/chunks\/[A-Za-z0-9_-]+\.js$/.test(url) ? path.join(js, "dist/browser", url) : undefined;
    const file = chunk !== undefined && existsSync(chunk) ? [chunk, "text/javascript"] as [string, string] : FILES[url];
    if (file === undefined) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { "content-type": file[1], "cache-control": "no-store" }).end(readFileSync(file[0]));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("no page server address");
  return { origin: `http://127.0.0.1:${address.port}`, server };
}

export interface Sent {
  url: string;
  method: string;
  body: Uint8Array;
  /** Chromium's CORS error when the request was blocked (then it never left the page). */
  corsError?: string;
}

/** A fresh headless Chromium (its own --user-data-dir), a page, and the log of every
 * request that page sends with its body's exact bytes. */
export async function launch(): Promise<{ browser: Browser; page: Page; sent: Sent[]; close(): Promise<void> }> {
  const profile = mkdtempSync(path.join(tmpdir(), "fedldp-chromium-"));
  const browser = await puppeteer.launch({
    executablePath: CHROMIUM, headless: true, args: [...FLAGS, `--user-data-dir=${profile}`],
  });
  const page = await browser.newPage();
  const cdp = await page.createCDPSession();
  await cdp.send("Network.enable", { maxPostDataSize: 1 << 20 });
  const sent: Sent[] = [];
  const byId = new Map<string, Sent>();
  cdp.on("Network.requestWillBeSent", (event) => {
    const entries = event.request.postDataEntries ?? [];
    const parts = entries.map((e) => Buffer.from(e.bytes ?? "", "base64"));
    if (entries.length === 0 && event.request.postData) parts.push(Buffer.from(event.request.postData, "utf8"));
    if (event.request.hasPostData && parts.length === 0) {
      throw new Error(`a request body was not logged: ${event.request.url}`);
    }
    const entry: Sent = { url: event.request.url, method: event.request.method, body: new Uint8Array(Buffer.concat(parts)) };
    byId.set(event.requestId, entry);
    sent.push(entry);
  });
  cdp.on("Network.loadingFailed", (event) => {
    const entry = byId.get(event.requestId);
    if (entry !== undefined && event.corsErrorStatus !== undefined) entry.corsError = event.corsErrorStatus.corsError;
  });
  return {
    browser, page, sent,
    async close() {
      await browser.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
}

let loads = 0;

/** Load the test page afresh (a new document: the query changes each time) with `params`
 * and wait for its result (window.__result). */
export async function runPage(page: Page, origin: string, params: object, timeoutMs = 60_000): Promise<Record<string, unknown>> {
  loads += 1;
  await page.goto(`${origin}/index.html?load=${loads}#${encodeURIComponent(JSON.stringify(params))}`);
  await page.waitForFunction("window.__result !== undefined", { timeout: timeoutMs });
  return (await page.evaluate("window.__result")) as Record<string, unknown>;
}
