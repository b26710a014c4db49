// The append-only outbox (outbox_file.ts): record() appends one framed, checksummed change
// and fdatasyncs it; a crash can leave only a torn last frame, which load drops (that
// record() never returned) while every report that returned, its spend and its memo rows
// come back; corruption before the end is refused, not skipped; compaction keeps the file
// bounded; exactly-once holds across a crash (same ids and bytes, flushed once). A real
// crash: a child process recording is killed with SIGKILL and every id it printed (its
// record() had returned) is in the reopened outbox.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { BudgetExhaustedError } from "../src/client.js";
import { type Change, type State, type StateStore, applyChange, emptyState } from "../src/outbox.js";
import { FileStore, crc32, frame, parseLog } from "../src/outbox_file.js";
import { METRIC, NOW, offlineClient } from "./outbox_kit.js";

const here = path.dirname(fileURLToPath(import.meta.url));

function withDir(run: (dir: string) => Promise<void>): () => Promise<void> {
  return async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), "fedldp-outbox-"));
    try {
      await run(dir);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  };
}

const change = (i: number): Change => ({
  add: { id: i.toString(16).padStart(32, "0"), report: `0a10${"ab".repeat(40)}${i}` },
  spent: [`p@${i % 3}`, String(i)],
  memo: [["m", "k", `slot${i}`, "01"]],
});

/** The state after `n` changes (the reference a replay must equal). */
function expected(n: number): State {
  const state = emptyState();
  for (let i = 0; i < n; i += 1) applyChange(state, change(i));
  return state;
}

/** A state file in `dir`: an empty state, then changes 0, 1 and 2 appended; its path. */
async function threeChanges(dir: string): Promise<string> {
  const file = path.join(dir, "device.log");
  const store = new FileStore(file);
  await store.save(emptyState());
  const state = emptyState();
  for (let i = 0; i < 3; i += 1) {
    await store.append(state, change(i)); // `state` is the state before the change
    applyChange(state, change(i));
  }
  store.close();
  return file;
}

test("crc32 is IEEE CRC-32 (zlib's)", () => {
  assert.equal(crc32(new TextEncoder().encode("123456789")), 0xcbf43926);
});

test("a torn last frame is dropped wherever it was cut; the next append starts clean", withDir(async (dir) => {
  const file = await threeChanges(dir);
  const file0 = readFileSync(file);
  const whole = file0.subarray(0, parseLog(file0).validEnd); // the frames, without the preallocated zeros
  assert.ok(file0.subarray(whole.length).every((b) => b === 0) && file0.length > whole.length);
  const lastStart = whole.length - frame(change(2)).length;
  const cuts = [...Array(12).keys()].map((i) => lastStart + i); // within the length and CRC, the payload's start
  cuts.push(Math.floor((lastStart + whole.length) / 2), whole.length - 2, whole.length - 1);
  for (const cut of cuts) {
    // A crash mid-append: the file ends inside the last frame, or its tail is zero-filled.
    for (const bytes of [whole.subarray(0, cut), Buffer.concat([whole.subarray(0, cut), Buffer.alloc(whole.length - cut)])]) {
      writeFileSync(file, bytes);
      const reopened = new FileStore(file);
      assert.deepEqual(await reopened.load(), expected(2), `cut at ${cut} of ${whole.length}`);
      const again = expected(2);
      await reopened.append(again, change(7));
      applyChange(again, change(7));
      reopened.close();
      assert.deepEqual(await new FileStore(file).load(), again, `append after the cut at ${cut}`);
    }
  }
  // A bit flipped inside the last frame's payload: the same torn append, dropped.
  const flipped = Buffer.from(whole);
  flipped[whole.length - 3]! ^= 0x01;
  writeFileSync(file, flipped);
  assert.deepEqual(await new FileStore(file).load(), expected(2));
}));

test("a bad frame before the end is corruption: load refuses rather than drop later reports", withDir(async (dir) => {
  const file = await threeChanges(dir);
  const whole = readFileSync(file);
  const secondStart0 = parseLog(whole).validEnd;
  const secondStart = secondStart0 - frame(change(2)).length - frame(change(1)).length;
  const broken = Buffer.from(whole);
  broken[secondStart + 12]! ^= 0x01; // inside change 1's payload; change 2 follows intact
  writeFileSync(file, broken);
  await assert.rejects(new FileStore(file).load(), /corrupt at byte/);
  assert.throws(() => parseLog(Buffer.from("not a log")), /unknown device state format/);
}));

test("compaction keeps the file near the state's size and loses nothing", withDir(async (dir) => {
  const file = path.join(dir, "device.log");
  const store = new FileStore(file);
  await store.save(emptyState());
  const state = emptyState();
  let largest = 0;
  for (let i = 0; i < 1000; i += 1) {
    const step: Change = i % 2 === 0 ? change(i) : { remove: [change(i - 1).add!.id] };
    await store.append(state, step);
    applyChange(state, step);
    largest = Math.max(largest, statSync(file).size);
  }
  store.close();
  assert.deepEqual(await new FileStore(file).load(), state);
  // Compaction past max(64 KiB, the state) of frames, plus 256 KiB of preallocated zeros.
  assert.ok(largest < 2 * 64 * 1024 + 256 * 1024 + 4096, `the file grew to ${largest} B with at most one report pending`);
}));

test("a crash after record(): reports, spend and memo rows come back; the budget guard holds", withDir(async (dir) => {
  for (const name of ["valid", "memoized, valid"] as const) {
    const file = path.join(dir, `${name}.log`);
    const { client } = await offlineClient(new FileStore(file), name);
    await client.record(METRIC, "chrome");
    await client.record(METRIC, "firefox");
    const recorded = client.pendingReports(); // no close(): the process dies here
    const crashed = readFileSync(file);
    const stored = await new FileStore(file).load();
    assert.deepEqual(stored!.pending, recorded, name);
    if (name === "memoized, valid") {
      assert.equal(Object.keys(stored!.memoRows?.[METRIC] ?? {}).length, 1, "memo rows were not stored with the report");
    }
    writeFileSync(file, crashed);
    const { client: after, collector } = await offlineClient(new FileStore(file), name);
    assert.deepEqual(after.pendingReports(), recorded);
    // Cap 4 with charge 1 (GRR) or 1.573173 (RAPPOR-GRR, so 2 fit): the spend before the crash counts.
    if (name === "valid") {
      await after.record(METRIC, "safari");
      await after.record(METRIC, "other");
    }
    await assert.rejects(after.record(METRIC, "chrome"), BudgetExhaustedError);
    // Exactly once: the outbox sends each stored report (same id and bytes) and then forgets it.
    const sent = await after.flush();
    assert.equal(sent.pending, 0);
    assert.deepEqual(collector.accepted.slice(0, 2), recorded.map((p) => p.id));
    const { client: third } = await offlineClient(new FileStore(file), name);
    assert.deepEqual(third.pendingReports(), [], "acknowledged reports came back after a restart");
    await assert.rejects(third.record(METRIC, "chrome"), BudgetExhaustedError);
  }
}));

test("a device process killed (SIGKILL) while recording keeps every report whose record() returned", withDir(async (dir) => {
  const file = path.join(dir, "device.log");
  const child = spawn(process.execPath, [path.join(here, "crash_child.js"), file], { stdio: ["ignore", "pipe", "inherit"] });
  const printed: string[] = [];
  let buffer = "";
  await new Promise<void>((resolve, reject) => {
    child.on("exit", () => resolve());
    child.on("error", reject);
    child.stdout.on("data", (chunk: Buffer) => {
      buffer += chunk.toString("utf8");
      const lines = buffer.split("\n");
      buffer = lines.pop()!;
      printed.push(...lines);
      if (printed.length >= 30) child.kill("SIGKILL"); // mid-way through the next record()
    });
  });
  assert.ok(printed.length >= 30 && printed.length < 100, `the child printed ${printed.length} ids before it died`);
  const state = (await new FileStore(file).load())!;
  const ids = state.pending.map((p) => p.id);
  assert.deepEqual(ids.slice(0, printed.length), printed);
  assert.ok(ids.length <= printed.length + 1);
  // Each day's spend is exactly its stored reports (charge 1 each): report and charge together.
  const days = new Map<string, number>();
  for (let i = 0; i < ids.length; i += 1) {
    const key = `conformance.browser@${NOW - (NOW % 86_400n) + BigInt(Math.floor(i / 4)) * 86_400n}`;
    days.set(key, (days.get(key) ?? 0) + 1);
  }
  assert.deepEqual(state.spent, Object.fromEntries([...days].map(([k, v]) => [k, String(v)])));
}));

test("a state file of the earlier layout (plain JSON) is read whole, then rewritten as a log", withDir(async (dir) => {
  const file = path.join(dir, "device.json");
  const old = expected(3);
  writeFileSync(file, JSON.stringify(old));
  const store = new FileStore(file);
  const state = (await store.load())!;
  assert.deepEqual(state, old);
  await store.append(state, change(3)); // the first write of a JSON file is a full save
  applyChange(state, change(3));
  store.close();
  assert.equal(readFileSync(file).subarray(0, 8).toString("latin1"), "FEDLDPL1");
  assert.deepEqual(await new FileStore(file).load(), expected(4));
}));

test("a write that fails changes nothing: no report pending, no spend, the next record() proceeds", withDir(async (dir) => {
  const file = path.join(dir, "device.log");
  const store = new FileStore(file);
  let fail = false;
  const failing: StateStore = {
    load: () => store.load(),
    save: (state) => (fail ? Promise.reject(new Error("disk full")) : store.save(state)),
    append: (state, step) => (fail ? Promise.reject(new Error("disk full")) : store.append(state, step)),
    close: () => store.close(),
  };
  const { client } = await offlineClient(failing);
  await client.record(METRIC, "chrome");
  fail = true;
  await assert.rejects(client.record(METRIC, "firefox"), /disk full/);
  assert.equal(client.pendingReports().length, 1, "a report whose write failed is pending");
  fail = false;
  // Cap 4, charge 1: had the failed record been charged, only two more would fit.
  for (const label of ["safari", "other", "chrome"]) await client.record(METRIC, label);
  await assert.rejects(client.record(METRIC, "chrome"), BudgetExhaustedError);
  assert.equal(client.pendingReports().length, 4);
  assert.deepEqual((await new FileStore(file).load())!.pending, client.pendingReports());
}));
