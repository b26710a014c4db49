/**
 * Policy verification against pinned roots: the same order of checks and the same
 * verdicts as the Python reference (client/policy/verify.py, trust.py):
 * payload type, an Ed25519 signature over DSSE PAE(type, exact payload bytes) by a
 * policy key the trusted root lists and that has not expired (before parsing),
 * content, validity interval, rollback, the device's ε maximum, audience.
 * Error classes carry the Python class names (`code`), as in conformance/v1/policies.json.
 */
import { fromBinary } from "@bufbuild/protobuf";
import {
  MemoCharging, type Policy, type Root, type SignedEnvelope, PolicySchema, RootSchema, SignedEnvelopeSchema,
} from "./gen/fedldp/v1/policy_pb.js";
import { type Rational, compare, parseDecimal, parseSignedDecimal } from "./exact.js";
import { type AttributeDomain, MAX_OPEN_DOMAIN_BYTES, type Mechanism, type MetricDomain, createMechanism } from "./mechanisms.js";

export const POLICY_PAYLOAD_TYPE = "application/vnd.fedldp.policy.v1+proto";
export const ROOT_PAYLOAD_TYPE = "application/vnd.fedldp.root.v1+proto";
const MAX_PAYLOAD_BYTES = 8 * 1024 * 1024;
const MAX_SIGNATURES = 16;

/** A refused policy or root; `code` is the reference's error class name. */
export class PolicyError extends Error {
  constructor(readonly code: string, message: string) {
    super(message);
    this.name = code;
  }
}

const encoder = new TextEncoder();

/** DSSE v1 pre-authentication encoding. */
export function pae(payloadType: string, payload: Uint8Array): Uint8Array {
  const type = encoder.encode(payloadType);
  const head = encoder.encode(`DSSEv1 ${type.length} `);
  const mid = encoder.encode(` ${payload.length} `);
  const out = new Uint8Array(head.length + type.length + mid.length + payload.length);
  out.set(head, 0);
  out.set(type, head.length);
  out.set(mid, head.length + type.length);
  out.set(payload, head.length + type.length + mid.length);
  return out;
}

export function hex(bytes: Uint8Array): string {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

export function fromHex(text: string): Uint8Array {
  const out = new Uint8Array(text.length / 2);
  for (let i = 0; i < out.length; i += 1) out[i] = parseInt(text.slice(2 * i, 2 * i + 2), 16);
  return out;
}

/** A copy backed by a plain ArrayBuffer (what WebCrypto's types ask for). */
function plain(data: Uint8Array): Uint8Array<ArrayBuffer> {
  return new Uint8Array(data);
}

export async function sha256(data: Uint8Array): Promise<Uint8Array> {
  return new Uint8Array(await globalThis.crypto.subtle.digest("SHA-256", plain(data)));
}

/** Lowercase hex SHA-256 of a raw 32-byte Ed25519 public key (the wire key_id). */
export async function keyIdOf(raw: Uint8Array): Promise<string> {
  return hex(await sha256(raw));
}

let webCryptoEd25519: boolean | undefined;

/** Ed25519 verification: WebCrypto where it has Ed25519, @noble/ed25519 otherwise. */
export async function verifyEd25519(
  publicKey: Uint8Array, signature: Uint8Array, message: Uint8Array,
): Promise<boolean> {
  if (signature.length !== 64 || publicKey.length !== 32) return false;
  if (webCryptoEd25519 !== false) {
    try {
      const key = await globalThis.crypto.subtle.importKey(
        "raw", plain(publicKey), { name: "Ed25519" }, false, ["verify"]);
      webCryptoEd25519 = true;
      return await globalThis.crypto.subtle.verify({ name: "Ed25519" }, key, plain(signature), plain(message));
    } catch {
      if (webCryptoEd25519 === true) return false; // supported, but this key is malformed
      webCryptoEd25519 = false;
    }
  }
  try {
    // Loaded only here (a separate chunk of the browser bundles): most browsers verify with WebCrypto.
    const noble = await import("@noble/ed25519");
    return await noble.verifyAsync(signature, message, publicKey);
  } catch {
    return false;
  }
}

async function validSigners(
  envelope: SignedEnvelope, keys: Map<string, Uint8Array>,
): Promise<Set<string>> {
  const message = pae(envelope.payloadType, envelope.payload);
  const signers = new Set<string>();
  for (const signature of envelope.signatures.slice(0, MAX_SIGNATURES)) {
    const key = keys.get(signature.keyId);
    if (key === undefined || signers.has(signature.keyId)) continue;
    if (await verifyEd25519(key, signature.sig, message)) signers.add(signature.keyId);
  }
  return signers;
}

function checkPayloadType(envelope: SignedEnvelope, expected: string): void {
  if (envelope.payloadType !== expected) {
    throw new PolicyError("PayloadTypeError", `envelope payload type is not ${expected}`);
  }
  if (envelope.payload.length > MAX_PAYLOAD_BYTES) {
    throw new PolicyError("InvalidPolicyError", "payload larger than 8 MiB");
  }
}

interface TrustedRoot {
  /** The serialized root SignedEnvelope (what the device stores to keep this trust). */
  envelope: Uint8Array;
  message: Root;
  rootKeys: Map<string, Uint8Array>;
  policyKeys: Map<string, { key: Uint8Array; expiresAt: bigint }>;
}

async function keysOf(entries: Root["rootKeys"]): Promise<Map<string, Uint8Array>> {
  const map = new Map<string, Uint8Array>();
  for (const entry of entries) map.set(await keyIdOf(entry.ed25519), entry.ed25519);
  return map;
}

async function parseRoot(envelope: SignedEnvelope): Promise<Omit<TrustedRoot, "envelope">> {
  let message: Root;
  try {
    message = fromBinary(RootSchema, envelope.payload);
  } catch {
    throw new PolicyError("RootRotationError", "root payload is not a fedldp.v1.Root");
  }
  if (message.rootThreshold < 1 || message.rootKeys.length < message.rootThreshold) {
    throw new PolicyError("RootRotationError", "root threshold is not satisfiable");
  }
  const policyKeys = new Map<string, { key: Uint8Array; expiresAt: bigint }>();
  for (const entry of message.policyKeys) {
    policyKeys.set(await keyIdOf(entry.ed25519), { key: entry.ed25519, expiresAt: entry.expiresAt });
  }
  return { message, rootKeys: await keysOf(message.rootKeys), policyKeys };
}

/** Pinned root keys and the current verified Root (TUF-style rotation). */
export class TrustStore {
  private constructor(private root: TrustedRoot) {}

  /** Trust `rootEnvelope` (serialized SignedEnvelope) if a threshold of pinned keys signed it. */
  static async fromPinnedRoot(rootEnvelope: Uint8Array, pinned: Uint8Array[]): Promise<TrustStore> {
    if (pinned.length === 0) throw new PolicyError("RootRotationError", "no pinned root keys");
    const envelope = fromBinary(SignedEnvelopeSchema, rootEnvelope);
    checkPayloadType(envelope, ROOT_PAYLOAD_TYPE);
    const pinnedKeys = new Map<string, Uint8Array>();
    for (const key of pinned) pinnedKeys.set(await keyIdOf(key), key);
    const signers = await validSigners(envelope, pinnedKeys);
    if (signers.size === 0) throw new PolicyError("RootRotationError", "root not signed by a pinned key");
    const root = await parseRoot(envelope);
    const own = await validSigners(envelope, root.rootKeys);
    if (signers.size < root.message.rootThreshold || own.size < root.message.rootThreshold) {
      throw new PolicyError("RootRotationError", "root lacks a threshold of signatures");
    }
    return new TrustStore({ ...root, envelope: rootEnvelope });
  }

  /**
   * The trust a device stored (trust.py TrustStore.from_bytes): `rootEnvelope` is the
   * highest root it verified earlier (the chain from the pinned root was checked then); its
   * own threshold of signatures is re-checked, so corrupted storage is refused (RootRotationError).
   */
  static async fromStoredRoot(rootEnvelope: Uint8Array): Promise<TrustStore> {
    let envelope: SignedEnvelope;
    try {
      envelope = fromBinary(SignedEnvelopeSchema, rootEnvelope);
    } catch {
      throw new PolicyError("RootRotationError", "stored root is not a SignedEnvelope");
    }
    checkPayloadType(envelope, ROOT_PAYLOAD_TYPE);
    const root = await parseRoot(envelope);
    const own = await validSigners(envelope, root.rootKeys);
    if (own.size < root.message.rootThreshold) throw new PolicyError("RootRotationError", "stored root lacks its own threshold");
    return new TrustStore({ ...root, envelope: rootEnvelope });
  }

  get rootVersion(): bigint { return this.root.message.version; }

  /** The serialized envelope of the current root (stored so a restart keeps a rotation). */
  get rootEnvelope(): Uint8Array { return this.root.envelope; }

  /** Apply newer roots in order (each version exactly current + 1, signed by both key sets). */
  async updateRoots(envelopes: Uint8Array[]): Promise<void> {
    for (const bytes of envelopes) {
      const envelope = fromBinary(SignedEnvelopeSchema, bytes);
      checkPayloadType(envelope, ROOT_PAYLOAD_TYPE);
      const byCurrent = await validSigners(envelope, this.root.rootKeys);
      if (byCurrent.size < this.root.message.rootThreshold) {
        throw new PolicyError("RootRotationError", "new root lacks the current root's threshold");
      }
      const next = await parseRoot(envelope);
      if (next.message.version <= this.root.message.version) continue;
      if (next.message.version !== this.root.message.version + 1n) {
        throw new PolicyError("RootRotationError", "root versions must increase by one");
      }
      const own = await validSigners(envelope, next.rootKeys);
      if (own.size < next.message.rootThreshold) {
        throw new PolicyError("RootRotationError", "new root lacks its own threshold");
      }
      this.root = { ...next, envelope: bytes };
    }
  }

  /** The policy key `keyId`, if the current root lists it unexpired at `now`. */
  policyKey(keyId: string, now: bigint): Uint8Array {
    const entry = this.root.policyKeys.get(keyId);
    if (entry === undefined) throw new PolicyError("UnknownKeyError", "policy key not listed by the trusted root");
    if (now >= this.root.message.expiresAt) throw new PolicyError("ExpiredKeyError", "trusted root expired");
    if (entry.expiresAt !== 0n && now >= entry.expiresAt) {
      throw new PolicyError("ExpiredKeyError", "policy key expired");
    }
    return entry.key;
  }
}

/** A policy whose signature, content and validity were checked. */
export interface VerifiedPolicy {
  payload: Uint8Array;
  digest: Uint8Array;
  message: Policy;
  policyId: string;
  version: bigint;
  metricName: string;
  labels: string[];
  /** The mechanism's domain: k, or the numeric range (exact bounds). */
  domain: MetricDomain;
  epsilon: Rational;
  epsilonCap: Rational;
  charge: Rational;
  windowSeconds: bigint;
  notBefore: bigint;
  expiresAt: bigint;
  keyId: string;
  mechanism: Mechanism;
  /** A shuffle-model policy's analyzer key (raw X25519): every report is sealed to it. */
  analyzerPublicKey?: Uint8Array;
}

export interface VerifyOptions {
  now: bigint;
  highestVersions?: Record<string, bigint>;
  maxEpsilon?: Rational;
  audience?: string;
}

async function verifySignature(envelope: SignedEnvelope, trust: TrustStore, now: bigint): Promise<string> {
  const signatures = envelope.signatures.slice(0, MAX_SIGNATURES);
  if (signatures.length === 0) throw new PolicyError("BadSignatureError", "envelope has no signatures");
  const message = pae(envelope.payloadType, envelope.payload);
  let firstError: PolicyError | undefined;
  let bad = false;
  for (const signature of signatures) {
    let key: Uint8Array;
    try {
      key = trust.policyKey(signature.keyId, now);
    } catch (error) {
      if (!(error instanceof PolicyError)) throw error;
      if (firstError === undefined || firstError.code === "UnknownKeyError") firstError = error;
      continue;
    }
    if (await verifyEd25519(key, signature.sig, message)) return signature.keyId;
    bad = true;
  }
  if (bad) throw new PolicyError("BadSignatureError", "signature does not verify over the payload");
  throw firstError ?? new PolicyError("BadSignatureError", "no signature could be checked");
}

function domainDigest(values: string[]): Promise<Uint8Array> {
  const parts: number[] = [];
  for (const value of values) {
    const bytes = encoder.encode(value);
    parts.push((bytes.length >>> 24) & 255, (bytes.length >>> 16) & 255, (bytes.length >>> 8) & 255, bytes.length & 255);
    parts.push(...bytes);
  }
  return sha256(new Uint8Array(parts));
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

/** Content checks this SDK makes; every problem is listed. Returns the built mechanism. */
async function contentCheck(policy: Policy): Promise<Content> {
  const problems: string[] = [];
  const decimal = (text: string, what: string): Rational | undefined => {
    try {
      const x = parseDecimal(text);
      if (x.num > 0n) return x;
    } catch { /* reported below */ }
    problems.push(`${what} must be a positive plain decimal`);
    return undefined;
  };
  if (!policy.policyId) problems.push("policy_id is empty");
  const spec = policy.mechanism;
  const epsilon = decimal(spec?.epsilon ?? "", "mechanism.epsilon");
  const cap = decimal(policy.budget?.epsilonCap ?? "", "budget.epsilon_cap");
  if (!policy.budget || policy.budget.windowSeconds <= 0n) problems.push("budget.window_seconds must be positive");
  if (policy.expiresAt <= policy.notBefore) problems.push("expires_at must be after not_before");
  const permanent = memoProblems(policy, epsilon, problems, decimal);
  if (policy.shuffle !== undefined) { // validation._shuffle_problems
    if (policy.shuffle.analyzerPublicKey.length !== 32) problems.push("shuffle.analyzer_public_key must be a raw 32-byte X25519 public key");
    if (policy.shuffle.minBatch < 2n) problems.push("shuffle.min_batch must be at least 2 (one report is not shuffled)");
  }
  const { domain, labels } = await metricDomain(policy, problems);
  if (problems.length > 0 || epsilon === undefined || cap === undefined) {
    throw new PolicyError("InvalidPolicyError", `policy is invalid: ${problems.join("; ")}`);
  }
  if (domain === undefined) {
    throw new PolicyError("UnsupportedMechanismError", `this SDK does not randomize ${policy.metric?.kind.case} metrics yet`);
  }
  let mechanism: Mechanism;
  try {
    mechanism = createMechanism(spec?.id ?? "", epsilon, domain, { ...(spec?.params ?? {}) });
  } catch (error) {
    throw new PolicyError("UnsupportedMechanismError", (error as Error).message);
  }
  if (mechanism.memoized !== (permanent !== undefined)) {
    throw new PolicyError("UnsupportedMechanismError", `mechanism ${mechanism.id} is ${mechanism.memoized ? "" : "not "}memoized in this SDK`);
  }
  if (compare(cap, mechanism.charge) < 0) {
    throw new PolicyError("InvalidPolicyError", "policy is invalid: budget.epsilon_cap is below the per-report cost");
  }
  return { mechanism, epsilon, cap, labels, domain, permanent };
}

interface Content {
  mechanism: Mechanism;
  epsilon: Rational;
  cap: Rational;
  labels: string[];
  domain: MetricDomain;
  permanent: Rational | undefined;
}

/** Memoized charging and epsilon_permanent go together, ε1 <= ε∞ (validation._memo_problems). */
function memoProblems(
  policy: Policy, epsilon: Rational | undefined, problems: string[],
  decimal: (text: string, what: string) => Rational | undefined,
): Rational | undefined {
  const spec = policy.mechanism;
  const charging = spec?.memoCharging ?? MemoCharging.UNSPECIFIED;
  const memoized = charging === MemoCharging.JOINT || charging === MemoCharging.INSTANTANEOUS;
  if (!memoized && charging !== MemoCharging.NONE) problems.push("mechanism.memo_charging must be none, joint or instantaneous");
  const text = spec?.params.epsilon_permanent;
  if (memoized && text === undefined) problems.push("mechanism.memo_charging is memoized but mechanism.params.epsilon_permanent is missing");
  if (text !== undefined && !memoized) problems.push("mechanism.params.epsilon_permanent is set but memo_charging is not joint");
  if (text === undefined) return undefined;
  const permanent = decimal(text, "mechanism.params.epsilon_permanent");
  if (permanent !== undefined && epsilon !== undefined && compare(epsilon, permanent) > 0) {
    problems.push("mechanism.epsilon exceeds mechanism.params.epsilon_permanent");
  }
  return permanent;
}

/** The metric's domain: k labels (digest checked) or a numeric range; undefined for kinds not randomized here. */
async function metricDomain(policy: Policy, problems: string[]): Promise<{ domain?: MetricDomain; labels: string[] }> {
  const metric = policy.metric;
  if (metric?.kind.case === "categorical") {
    const labels = metric.kind.value.values;
    if (labels.length < 2 || new Set(labels).size !== labels.length) problems.push("labels must be >= 2 and unique");
    if (!sameBytes(await domainDigest(labels), metric.kind.value.digest)) problems.push("domain digest mismatch");
    return { domain: labels.length, labels };
  }
  if (metric?.kind.case === "numeric") {
    const range = numericRange(metric.kind.value.lo, metric.kind.value.hi);
    if (range !== undefined) return { domain: range, labels: [] };
    problems.push("metric.numeric needs plain decimals lo < hi");
    return { labels: [] };
  }
  if (metric?.kind.case === "open") {
    const maxBytes = metric.kind.value.maxBytes;
    if (maxBytes >= 1 && maxBytes <= MAX_OPEN_DOMAIN_BYTES) return { domain: { maxBytes }, labels: [] };
    problems.push(`metric.open.max_bytes must be in [1, ${MAX_OPEN_DOMAIN_BYTES}]`);
    return { labels: [] };
  }
  if (metric?.kind.case === "multi") {
    const attributes: AttributeDomain[] = [];
    for (const [i, a] of metric.kind.value.attributes.entries()) {
      const where = `metric.multi.attributes[${i}]`;
      const mechanism = { name: a.name, mechanism: a.mechanism?.id ?? "", params: { ...(a.mechanism?.params ?? {}) } };
      if (a.kind.case === "categorical") {
        const labels = a.kind.value.values;
        if (labels.length < 2 || new Set(labels).size !== labels.length) problems.push(`${where} labels must be >= 2 and unique`);
        if (!sameBytes(await domainDigest(labels), a.kind.value.digest)) problems.push(`${where} domain digest mismatch`);
        attributes.push({ ...mechanism, labels });
      } else if (a.kind.case === "numeric") {
        const range = numericRange(a.kind.value.lo, a.kind.value.hi);
        if (range === undefined) problems.push(`${where}.numeric needs plain decimals lo < hi`);
        else attributes.push({ ...mechanism, range });
      } else {
        problems.push(`${where} has no domain`);
      }
    }
    return { domain: { attributes }, labels: [] };
  }
  if (metric?.kind.case === undefined) problems.push("metric has no domain");
  return { labels: [] };
}

function numericRange(loText: string, hiText: string): { lo: Rational; hi: Rational } | undefined {
  try {
    const lo = parseSignedDecimal(loText);
    const hi = parseSignedDecimal(hiText);
    if (compare(lo, hi) < 0) return { lo, hi };
  } catch { /* undefined below */ }
  return undefined;
}

/** Verify a serialized SignedEnvelope; resolves to the VerifiedPolicy or rejects with a PolicyError. */
export async function verifyPolicy(
  envelopeBytes: Uint8Array, trust: TrustStore, options: VerifyOptions,
): Promise<VerifiedPolicy> {
  const envelope = fromBinary(SignedEnvelopeSchema, envelopeBytes);
  checkPayloadType(envelope, POLICY_PAYLOAD_TYPE);
  const keyId = await verifySignature(envelope, trust, options.now);
  let policy: Policy;
  try {
    policy = fromBinary(PolicySchema, envelope.payload);
  } catch {
    throw new PolicyError("InvalidPolicyError", "payload is not a fedldp.v1.Policy");
  }
  const { mechanism, epsilon, cap, labels, domain, permanent } = await contentCheck(policy);
  const name = `policy ${policy.policyId} v${policy.version}`;
  if (options.now < policy.notBefore) throw new PolicyError("NotYetValidPolicyError", `${name} is not yet valid`);
  if (options.now >= policy.expiresAt) throw new PolicyError("ExpiredPolicyError", `${name} expired`);
  const highest = options.highestVersions?.[policy.policyId];
  if (highest !== undefined && policy.version < highest) {
    throw new PolicyError("RollbackError", `${name} is older than version ${highest} already accepted`);
  }
  if (options.maxEpsilon !== undefined && compare(mechanism.charge, options.maxEpsilon) > 0) {
    throw new PolicyError("EpsilonAboveMaximumError", `${name} costs more per report than this device's maximum`);
  }
  if (options.maxEpsilon !== undefined && permanent !== undefined && compare(permanent, options.maxEpsilon) > 0) {
    throw new PolicyError("EpsilonAboveMaximumError", `${name} asks a permanent (memoized) epsilon above this device's maximum`);
  }
  if (options.audience !== undefined && !policy.audience.includes(options.audience)) {
    throw new PolicyError("AudienceMismatchError", `${name} is not addressed to ${options.audience}`);
  }
  const metric = policy.metric;
  return {
    payload: envelope.payload,
    digest: await sha256(envelope.payload),
    message: policy,
    policyId: policy.policyId,
    version: policy.version,
    metricName: metric?.name ?? "",
    labels,
    domain,
    epsilon,
    epsilonCap: cap,
    charge: mechanism.charge,
    windowSeconds: policy.budget?.windowSeconds ?? 0n,
    notBefore: policy.notBefore,
    expiresAt: policy.expiresAt,
    keyId,
    mechanism,
    ...(policy.shuffle === undefined ? {} : { analyzerPublicKey: policy.shuffle.analyzerPublicKey }),
  };
}
