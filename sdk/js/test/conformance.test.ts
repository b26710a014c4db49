// The TypeScript SDK against conformance/v1/*.json (the Python reference's vectors).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import * as path from "node:path";
import { create, toBinary } from "@bufbuild/protobuf";
import { ReportSchema, SubmitRequestSchema } from "../src/gen/fedldp/v1/collector_pb.js";
import { equal, parseDecimal } from "../src/exact.js";
import { olhHash, pemHash, prefixChunks, sketchHash } from "../src/mechanisms.js";
import { sha256Sync } from "../src/sha256.js";
import { createHash, randomBytes } from "node:crypto";
import { outputOf } from "./vectors.js";
import { PolicyError, TrustStore, fromHex, hex, verifyPolicy } from "../src/policy.js";
import { ReportIds, makeReport, submitRequestBytes } from "../src/wire.js";
import type { RandomSource } from "../src/random.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const vectorsDir = path.resolve(here, "../../../../conformance/v1");
// eslint-disable-next-line @typescript-eslint/no-explicit-any
const load = (name: string): any => JSON.parse(readFileSync(path.join(vectorsDir, name), "utf8"));


test("OLH hash family on the fixed inputs", () => {
  for (const row of load("hashes.json").olh) {
    row.seeds.forEach((seed: string | number, i: number) => {
      const got = row.values.map((v: number) => Number(olhHash(BigInt(seed), BigInt(v), BigInt(row.g), row.m)));
      assert.deepEqual(got, row.hashes[i]);
    });
  }
});

test("sketch hash family on the fixed inputs; sha256Sync equals node:crypto", () => {
  for (const row of load("hashes.json").sketch) {
    const data = fromHex(row.utf8);
    assert.deepEqual(row.cells.map((_: number, j: number) => sketchHash(j, data, row.columns)), row.cells);
  }
  for (let n = 0; n < 200; n += 1) {
    const data = randomBytes(n);
    assert.equal(hex(sha256Sync(data)), createHash("sha256").update(data).digest("hex"), `${n} bytes`);
  }
});

test("PEM hash family (prefix chunks, multiply-add-shift) on the fixed inputs", () => {
  let checked = 0;
  for (const row of load("hashes.json").pem) {
    const padded = new Uint8Array(row.max_bytes);
    padded.set(fromHex(row.utf8));
    const chunks = prefixChunks(padded, row.prefix_bits);
    assert.deepEqual(chunks.map(Number), row.chunks);
    for (const [bits, hash] of Object.entries(row.hashes)) {
      assert.equal(pemHash(fromHex(row.key), chunks, Number(bits)), hash);
      checked += 1;
    }
  }
  assert.ok(checked >= 12);
});

test("SubmitRequest bytes equal the vectors for the payload kinds this SDK emits", () => {
  let checked = 0;
  for (const c of load("wire.json").cases) {
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    if (!c.reports.every((r: any) => ["category", "bits", "hashed", "numeric", "multi", "index_bits", "sketch_row", "sketch_bit", "group_hashed"].includes(r.output.kind))) continue;
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    const reports = c.reports.map((r: any) => makeReport({
      reportId: fromHex(r.report_id), policyId: r.policy_id, policyVersion: BigInt(r.policy_version),
      policyDigest: fromHex(r.policy_digest), coarseTime: BigInt(r.coarse_time),
    }, outputOf(r.output)));
    const generated = toBinary(SubmitRequestSchema, create(SubmitRequestSchema, { reports }));
    assert.equal(hex(generated), c.submit_request);
    const raw = submitRequestBytes(reports.map((r: ReturnType<typeof makeReport>) => toBinary(ReportSchema, r)));
    assert.equal(hex(raw), c.submit_request);
    checked += 1;
  }
  assert.ok(checked >= 10, `${checked} cases`);
});

test("report ids follow the vectors' layout", () => {
  const data = load("report_ids.json");
  for (const run of data.runs) {
    const prefix = fromHex(run.prefix);
    const start = BigInt(run.start);
    const fixed: RandomSource = {
      fill(array: Uint32Array) {
        const view = new DataView(prefix.buffer);
        array[0] = view.getUint32(0);
        array[1] = view.getUint32(4);
        array[2] = Number(start >> 32n);
        array[3] = Number(start & 0xffffffffn);
      },
    };
    const ids = new ReportIds(fixed, data.run_length);
    assert.deepEqual(run.ids.map(() => hex(ids.next())), run.ids);
  }
});

test("policy envelopes get the vectors' verdicts", async () => {
  const data = load("policies.json");
  const trust = await TrustStore.fromPinnedRoot(
    fromHex(data.trust.root_envelope), data.trust.pinned_root_keys.map(fromHex));
  let checked = 0;
  for (const c of data.cases) {
    const highestVersions: Record<string, bigint> = {};
    for (const [id, v] of Object.entries(c.highest_versions)) highestVersions[id] = BigInt(v as number);
    let verdict = "ok";
    try {
      const verified = await verifyPolicy(fromHex(c.envelope), trust, {
        now: BigInt(c.now), highestVersions,
        ...(c.max_epsilon === null ? {} : { maxEpsilon: parseDecimal(c.max_epsilon) }),
        ...(c.audience === null ? {} : { audience: c.audience }),
      });
      assert.equal(hex(verified.digest), c.digest, c.name);
      assert.equal(verified.keyId, c.key_id, c.name);
      assert.equal(verified.policyId, c.policy_id);
      assert.ok(equal(verified.charge, parseDecimal(c.report_charge)), c.name);
      assert.equal(verified.mechanism.id, c.mechanism, c.name);
    } catch (error) {
      if (!(error instanceof PolicyError)) throw error;
      verdict = error.code;
    }
    assert.equal(verdict, c.verdict, c.name);
    checked += 1;
  }
  assert.equal(checked, data.cases.length);
});
