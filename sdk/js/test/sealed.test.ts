// Sealed payloads (shuffle model) against conformance/v1/sealed.json, the Python reference's
// vectors: HPKE `info`, the framed and padded plaintext, the key id, and — sealing with the
// vectors' fixed ephemeral key material — the whole ciphertext and wire Report, byte for
// byte; the TS side opens the reference's ciphertexts. Broken variants (another policy
// version in `info`, a plaintext cut to its payload) must not reproduce the vectors.
import { test } from "node:test";
import assert from "node:assert/strict";
import { hex } from "../src/policy.js";
import { hpkeOpen, hpkeSeal } from "../src/hpke.js";
import { padPayload, sealInfo, sealKeyId } from "../src/sealed.js";
import { payloadOnlyBytes, sealedReportBytes } from "../src/wire.js";
import { fromHex, load, outputOf } from "./vectors.js";

const data = load("sealed.json");
const publicKey = fromHex(data.analyzer_public_key);

test("sealing equals the vectors byte for byte (info, padding, key id, ciphertext, report)", async () => {
  // Every payload kind this SDK emits (index_bit is a Python-only mechanism's).
  const cases = data.cases.filter((c: { output: { kind: string } }) => c.output.kind !== "index_bit");
  assert.ok(cases.length >= 10);
  for (const c of cases) {
    const output = outputOf(c.output);
    const header = {
      reportId: fromHex(c.report_id), policyId: c.policy_id, policyVersion: BigInt(c.policy_version),
      policyDigest: fromHex(c.policy_digest), coarseTime: BigInt(c.coarse_time),
    };
    const info = sealInfo(header.policyId, header.policyVersion, header.policyDigest);
    assert.equal(hex(info), c.info, c.output.kind);
    const plaintext = padPayload(payloadOnlyBytes(output));
    assert.equal(hex(plaintext), c.plaintext, c.output.kind);
    assert.equal(plaintext.length % 256, 0);
    assert.equal(await sealKeyId(publicKey), c.key_id);
    const report = await sealedReportBytes(header, output, publicKey, fromHex(c.ikm_e));
    assert.equal(hex(report), c.report, c.output.kind);
    // The reference's ciphertext opens here to the same plaintext.
    assert.equal(hex(await hpkeOpen(fromHex(data.analyzer_private_key), info, fromHex(c.ciphertext))), c.plaintext);
  }
});

test("broken variants do not reproduce the vectors; fresh seals differ and open", async () => {
  const c = data.cases[0];
  const output = outputOf(c.output);
  const wrongInfo = sealInfo(c.policy_id, BigInt(c.policy_version) + 1n, fromHex(c.policy_digest));
  const unpadded = payloadOnlyBytes(output);
  const sealedWrongInfo = await hpkeSeal(publicKey, wrongInfo, fromHex(c.plaintext), fromHex(c.ikm_e));
  assert.notEqual(hex(sealedWrongInfo), c.ciphertext, "info does not bind the policy version");
  const sealedUnpadded = await hpkeSeal(publicKey, fromHex(c.info), unpadded, fromHex(c.ikm_e));
  assert.notEqual(hex(sealedUnpadded), c.ciphertext, "the plaintext is not padded");
  await assert.rejects(hpkeOpen(fromHex(data.analyzer_private_key), wrongInfo, fromHex(c.ciphertext)));
  // Without ikmE the ephemeral key is fresh (CSPRNG): two seals differ, both open.
  const a = await hpkeSeal(publicKey, fromHex(c.info), fromHex(c.plaintext));
  const b = await hpkeSeal(publicKey, fromHex(c.info), fromHex(c.plaintext));
  assert.notEqual(hex(a), hex(b));
  for (const sealed of [a, b]) {
    assert.equal(sealed.length, 304);
    assert.equal(hex(await hpkeOpen(fromHex(data.analyzer_private_key), fromHex(c.info), sealed)), c.plaintext);
  }
});
