// The SDK against a real `fedldp collector serve` over its web endpoint (Connect protocol
// and gRPC-Web over HTTP/1.1, @connectrpc/connect-web with Node's fetch): exact ledger
// charges, exactly-once across a collector restart (the same bytes resent after the answer
// was lost are DUPLICATE), and the collector's refusals with the same codes as over gRPC.
import { test } from "node:test";
import assert from "node:assert/strict";
import { copyFileSync } from "node:fs";
import * as path from "node:path";
import { create, toBinary } from "@bufbuild/protobuf";
import { GetPoliciesRequestSchema } from "../src/gen/fedldp/v1/collector_pb.js";
import { equal, parseDecimal } from "../src/exact.js";
import { fromHex } from "../src/policy.js";
import { type ClientOptions, openClient } from "../src/node.js";
import { TransportError } from "../src/transport.js";
import { ConnectTransport } from "../src/transport_connect.js";
import { GrpcTransport } from "../src/transport_grpc.js";
import { ledgerWindows, makeDeployment, noCollector, removeDeployment, startCollector } from "./harness.js";

for (const protocol of ["connect", "grpc-web"] as const) {
  test(`${protocol}: charges exactly, exactly once across a collector restart`, { skip: noCollector }, async () => {
    const { dir, fixture } = makeDeployment(["http://page.invalid"]);
    let collector = await startCollector(dir, fixture);
    try {
      assert.ok(collector.webPort, "the collector wrote its web port");
      const options: ClientOptions = {
        webUrl: `http://127.0.0.1:${collector.webPort}`, protocol, token: fixture.token,
        pinnedRootKeys: fixture.pinned_root_keys.map(fromHex), rootEnvelope: fromHex(fixture.root_envelope),
        stateFile: path.join(dir, "device.json"), maxEpsilon: "2",
      };
      let client = await openClient(options);
      for (const label of ["a", "b", "c"]) await client.record(fixture.metrics.grr!, label);
      await client.record(fixture.metrics.olh!, "d");
      await client.close();
      copyFileSync(options.stateFile, path.join(dir, "before-flush.json"));

      client = await openClient(options);
      const first = await client.flush();
      assert.deepEqual([first.accepted, first.duplicate, first.pending], [4, 0, 0]);
      await client.close();

      // The collector restarts (same ledger, new port); the device lost the answer and resends.
      await collector.stop();
      collector = await startCollector(dir, fixture);
      copyFileSync(path.join(dir, "before-flush.json"), options.stateFile);
      client = await openClient({ ...options, webUrl: `http://127.0.0.1:${collector.webPort}` });
      const retry = await client.flush();
      assert.deepEqual([retry.accepted, retry.duplicate, retry.pending], [0, 4, 0]);
      await client.close();

      const spent = ledgerWindows(fixture, "device-js");
      assert.equal(spent["js.grr"]?.reports, 3);
      assert.ok(equal(parseDecimal(spent["js.grr"]?.epsilon_spent ?? ""), parseDecimal("1.5")));
      assert.equal(spent["js.olh"]?.reports, 1);
      assert.ok(equal(parseDecimal(spent["js.olh"]?.epsilon_spent ?? ""), parseDecimal("1")));
    } finally {
      await collector.stop();
      removeDeployment(dir);
    }
  });
}

/** The refusal of `call` (a TransportError), asserted to be one. */
async function refusal(call: Promise<unknown>): Promise<TransportError> {
  try {
    await call;
  } catch (error) {
    assert.ok(error instanceof TransportError, String(error));
    return error;
  }
  assert.fail("the call was not refused");
}

test("refusals: the same code and message over gRPC, Connect and gRPC-Web", { skip: noCollector }, async () => {
  const { dir, fixture } = makeDeployment(["http://page.invalid"]);
  // max_message_bytes 1024: a 2 KiB request is refused as too large on every transport.
  const collector = await startCollector(dir, fixture, { FEDLDP_COLLECTOR_MAX_MESSAGE_BYTES: "1024",
    FEDLDP_COLLECTOR_MAX_CONNECTION_INFLIGHT_BYTES: "65536", FEDLDP_COLLECTOR_MAX_INFLIGHT_BYTES: "65536" });
  try {
    const web = `http://127.0.0.1:${collector.webPort}`;
    // `body` replaces the request's message on the wire (the gRPC-Web frame kept), so the
    // collector, not the client's encoder, sees what a broken or hostile device would send.
    const transports = (token: string, body?: Uint8Array) => {
      const swap = (grpcWeb: boolean): typeof fetch => (input, init) => {
        if (body === undefined) return fetch(input, init);
        const framed = new Uint8Array(5 + body.length);
        new DataView(framed.buffer).setUint32(1, body.length);
        framed.set(body, 5);
        return fetch(input, { ...init, body: (grpcWeb ? framed : body) as Uint8Array<ArrayBuffer> });
      };
      return [
        new GrpcTransport({ address: `127.0.0.1:${collector.grpcPort}`, token, insecure: true }),
        new ConnectTransport({ baseUrl: web, token, protocol: "connect", fetch: swap(false) }),
        new ConnectTransport({ baseUrl: web, token, protocol: "grpc-web", fetch: swap(true) }),
      ] as const;
    };
    const policies = toBinary(GetPoliciesRequestSchema, create(GetPoliciesRequestSchema, {}));
    const empty = new Uint8Array(0);
    const seen: Record<string, string[]> = {};
    const refusals = async (kind: string, token: string, wire: Uint8Array | undefined, method: "Submit" | "GetPolicies") => {
      const [grpc, ...webs] = transports(token, wire);
      seen[kind] = [];
      const e = await refusal(grpc.call(method, wire ?? policies));
      seen[kind].push(`${e.code}: ${e.message}`);
      for (const t of webs) {
        const w = await refusal(t.call(method, method === "Submit" ? empty : policies));
        seen[kind].push(`${w.code}: ${w.message}`);
      }
    };
    await refusals("unauthenticated", "not-a-token", undefined, "GetPolicies");
    await refusals("malformed", fixture.token, new Uint8Array([0x0a, 0x05, 0x01]), "Submit");
    await refusals("too large", fixture.token, new Uint8Array(2048).fill(0x08), "Submit");
    // The same code and message everywhere; a too-large message is refused by grpcio's
    // transport with its own words, so only its code is compared.
    seen["too large"] = seen["too large"]!.map((answer) => answer.split(":")[0]!);
    for (const [kind, answers] of Object.entries(seen)) {
      assert.equal(new Set(answers).size, 1, `${kind}: ${JSON.stringify(answers)}`);
    }
    assert.match(seen.unauthenticated![0]!, /^UNAUTHENTICATED: /);
    assert.match(seen.malformed![0]!, /^INVALID_ARGUMENT: the request is not a valid fedldp\.v1\.SubmitRequest/);
    assert.equal(seen["too large"]![0], "RESOURCE_EXHAUSTED");
    assert.deepEqual(ledgerWindows(fixture, "device-js"), {});
  } finally {
    await collector.stop();
    removeDeployment(dir);
  }
});

test("the collector's retry hint reaches the SDK over every transport (rate limit)", { skip: noCollector }, async () => {
  const { dir, fixture } = makeDeployment(["http://page.invalid"]);
  const collector = await startCollector(dir, fixture, {
    FEDLDP_COLLECTOR_RATE_LIMIT_PER_SECOND: "0.001", FEDLDP_COLLECTOR_RATE_LIMIT_BURST: "1",
  });
  try {
    const web = `http://127.0.0.1:${collector.webPort}`;
    const policies = toBinary(GetPoliciesRequestSchema, create(GetPoliciesRequestSchema, {}));
    // One subject per transport (each has its own bucket of one call).
    const transports = [
      new GrpcTransport({ address: `127.0.0.1:${collector.grpcPort}`, token: fixture.token, insecure: true }),
      new ConnectTransport({ baseUrl: web, token: fixture.web_token, protocol: "connect" }),
      new ConnectTransport({ baseUrl: web, token: fixture.other_token, protocol: "grpc-web" }),
    ];
    const answers: [string, string, number | undefined][] = [];
    for (const t of transports) {
      await t.call("GetPolicies", policies);
      const e = await refusal(t.call("GetPolicies", policies));
      answers.push([e.code, e.message, e.retryAfterMs]);
      t.close();
    }
    for (const [code, message, hint] of answers) {
      assert.equal(code, "RESOURCE_EXHAUSTED");
      assert.equal(message, answers[0]![1]);
      assert.ok(hint !== undefined && hint > 0, `retry hint ${hint}`);
    }
  } finally {
    await collector.stop();
    removeDeployment(dir);
  }
});
