// The TypeScript SDK's figures (driven by bench/sdk_js.py, which takes the medians and
// writes the JSON): bundle sizes, record() latency in Node and in headless Chromium, and
// reports/s a page randomizes and persists. Prints one JSON object on stdout.
//   node dist/bench/sdk_bench.js [--runs N] [--n REPORTS]
// Each run: a fresh client records REPORTS reports (GRR, k = 3) and the per-call times
// are kept. Timed section: record() — policy lookup, budget check, randomization,
// serialization and the durable write of its change (Node: one framed append to the state
// file and fdatasync; Chromium: one put in an IndexedDB readwrite transaction, durability
// "strict"; now and then a compaction rewrites the whole state instead).
// References in the same run: the mechanism's perturb() alone (the randomizer floor),
// record() into an in-memory store (everything but the storage), and the storage floor:
// in Node a bare 250-byte write into preallocated space with fdatasync, in the page a bare
// IndexedDB transaction of one small put.
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { gzipSync } from "node:zlib";
import { build } from "esbuild";
// @ts-expect-error: a plain .mjs build script without types (the path from dist/bench/)
import { binaryOnly, connectWebParts } from "../../scripts/build_browser.mjs";
import { FedldpClient } from "../src/client.js";
import { fromHex } from "../src/policy.js";
import { type State, type StateStore } from "../src/outbox.js";
import { openClient, nodeTransport } from "../src/node.js";
import { launch, runPage, servePage } from "../test/chromium.js";
import { makeDeployment, removeDeployment, repo, startCollector } from "../test/harness.js";

const argv = process.argv.slice(2);
const arg = (name: string, fallback: number) => {
  const i = argv.indexOf(name);
  return i >= 0 ? Number(argv[i + 1]) : fallback;
};
const runs = arg("--runs", 5);
const n = arg("--n", 200);

class MemoryStore implements StateStore {
  private state: State | undefined;
  async load() { return this.state; }
  async save(state: State) { this.state = structuredClone(state); }
  async append() {} // record() keeps its change in memory only: everything but the storage
  close() {}
}

/** Minified and gzip -9 sizes of one bundle of `contents` (a module in sdk/js). */
async function sizeOf(contents: string): Promise<{ minified: number; gzip: number }> {
  const result = await build({
    stdin: { contents, resolveDir: path.join(repo, "sdk/js"), loader: "ts" },
    bundle: true, format: "esm", platform: "browser", target: "es2022", minify: true, legalComments: "none",
    write: false, resolveExtensions: [".ts", ".js"], logLevel: "warning", plugins: [connectWebParts, binaryOnly],
  });
  const bytes = result.outputFiles[0]!.contents;
  return { minified: bytes.length, gzip: gzipSync(bytes, { level: 9 }).length };
}

/** The floors: the protobuf-es runtime with the generated descriptors, then with connect-web's Connect transport. */
async function runtimeFloor(): Promise<Record<string, { minified: number; gzip: number }>> {
  const protobuf = `
    import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
    import { SubmitRequestSchema, SubmitResponseSchema, GetPoliciesRequestSchema, GetPoliciesResponseSchema } from "./src/gen/fedldp/v1/collector_pb.ts";
    export const f = [create, fromBinary, toBinary, SubmitRequestSchema, SubmitResponseSchema, GetPoliciesRequestSchema, GetPoliciesResponseSchema];`;
  return {
    reference_protobuf_es_only: await sizeOf(protobuf),
    reference_protobuf_es_and_connect_web: await sizeOf(`${protobuf}\nexport { ConnectTransport } from "./src/transport_connect.ts";`),
  };
}

/**
 * The storage floor in Node: a file with preallocated zeros where `append()` writes 250
 * bytes after the last and fdatasyncs them, timed (ms). Interleaved with record() calls so
 * both meet the same disk.
 */
async function bareLog(file: string): Promise<{ append(): Promise<number>; close(): Promise<void> }> {
  const handle = await fs.open(file, "w", 0o600);
  await handle.write(Buffer.alloc(n * 250 + 4096), 0, n * 250 + 4096, 0);
  await handle.sync();
  const frame = Buffer.alloc(250, 0x61);
  let at = 0;
  return {
    async append() {
      const t = performance.now();
      await handle.write(frame, 0, frame.length, at);
      await handle.datasync();
      at += frame.length;
      return performance.now() - t;
    },
    close: () => handle.close(),
  };
}

async function nodeRuns(dir: string, fixture: ReturnType<typeof makeDeployment>["fixture"], webUrl: string) {
  const common = {
    webUrl, token: fixture.token, pinnedRootKeys: fixture.pinned_root_keys.map(fromHex),
    rootEnvelope: fromHex(fixture.root_envelope),
  };
  const out: { record: number[][]; memory: number[][]; perturb: number[][]; bare: number[][]; seconds: number[] } =
    { record: [], memory: [], perturb: [], bare: [], seconds: [] };
  for (let r = 0; r < runs; r++) {
    const file = path.join(dir, `bench-${r}.json`);
    const client = await openClient({ ...common, stateFile: file });
    const memory = await FedldpClient.open({ ...common, store: new MemoryStore(), transport: nodeTransport({ ...common, stateFile: file }) });
    const metric = fixture.metrics.web!;
    const labels = fixture.web_labels;
    const times: number[] = [], mem: number[] = [], pert: number[] = [], bare: number[] = [];
    const floor = await bareLog(path.join(dir, `bare-${r}`));
    for (let i = 0; i < n; i++) {
      const t = performance.now();
      await client.record(metric, labels[i % labels.length]!);
      times.push(performance.now() - t);
      bare.push(await floor.append());
    }
    await floor.close();
    out.seconds.push(times.reduce((a, b) => a + b, 0) / 1000);
    for (let i = 0; i < n; i++) {
      const t = performance.now();
      await memory.record(metric, labels[i % labels.length]!);
      mem.push(performance.now() - t);
    }
    const mechanism = client.policy(metric)!.mechanism;
    for (let batch = 0; batch < 5; batch++) {
      const t = performance.now();
      for (let i = 0; i < 2000; i++) mechanism.perturb(i % labels.length);
      pert.push((performance.now() - t) / 2000);
    }
    out.record.push(times); out.memory.push(mem); out.perturb.push(pert); out.bare.push(bare);
    await client.close(); await memory.close();
  }
  return out;
}

async function main() {
  const { origin, server } = await servePage();
  const { dir, fixture } = makeDeployment([origin]);
  const collector = await startCollector(dir, fixture);
  const webUrl = `http://127.0.0.1:${collector.webPort}`;
  try {
    const node = await nodeRuns(dir, fixture, webUrl);
    const chromium: { record: number[][]; relaxed: number[][]; perturb: number[][]; bare: number[][]; reportsPerSecond: number[] } =
      { record: [], relaxed: [], perturb: [], bare: [], reportsPerSecond: [] };
    const browser = await launch();
    const chromiumVersion = await browser.browser.version();
    try {
      for (let r = 0; r < runs; r++) {
        const result = await runPage(browser.page, origin, {
          bundle: "fedldp.grr-olh.min.js", protocol: "connect", collectorUrl: webUrl, token: fixture.web_token,
          pinnedRootKeys: fixture.pinned_root_keys, rootEnvelope: fixture.root_envelope,
          metric: fixture.metrics.web, database: `bench-${r}`, mode: "bench", n, labels: fixture.web_labels,
        }, 300_000);
        if (!result.ok) throw new Error(String(result.error));
        chromium.record.push(result.times as number[]);
        chromium.perturb.push(result.perturbTimes as number[]);
        chromium.bare.push(result.floorTimes as number[]);
        chromium.reportsPerSecond.push(result.reportsPerSecond as number);
        const relaxed = await runPage(browser.page, origin, {
          bundle: "fedldp.grr-olh.min.js", protocol: "connect", collectorUrl: webUrl, token: fixture.web_token,
          pinnedRootKeys: fixture.pinned_root_keys, rootEnvelope: fixture.root_envelope, durability: "relaxed",
          metric: fixture.metrics.web, database: `bench-relaxed-${r}`, mode: "bench", n, labels: fixture.web_labels,
        }, 300_000);
        if (!relaxed.ok) throw new Error(String(relaxed.error));
        chromium.relaxed.push(relaxed.times as number[]);
      }
    } finally {
      await browser.close();
    }
    process.stdout.write(JSON.stringify({ runs, n, node, chromium, chromiumVersion, nodeVersion: process.version, runtimeFloor: await runtimeFloor() }));
  } finally {
    await collector.stop();
    server.close();
    removeDeployment(dir);
  }
}

await main();

