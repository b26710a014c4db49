/**
 * The Node device client: verified policies, record() into a durable file outbox,
 * flush() over gRPC, the on-device budget guard and the collector's retry hint.
 *
 * record(metric, label) randomizes once and writes the report's exact bytes (and its
 * id) to the state file (write to a temporary file, fsync, rename, fsync the
 * folder) before it returns; flush() resends those same bytes until the collector
 * answers, so a retry after a crash or a lost answer carries the same report id
 * and is charged once (DUPLICATE). The state file holds report bytes (randomized
 * outputs), spend per (policy id, window start) and the highest policy versions;
 * never a raw value. Errors and logs never include the value either.
 */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import * as grpc from "@grpc/grpc-js";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import {
  GetPoliciesRequestSchema, GetPoliciesResponseSchema, Outcome, SubmitResponseSchema,
  type SubmitResponse,
} from "./gen/fedldp/v1/collector_pb.js";
import { SignedEnvelopeSchema } from "./gen/fedldp/v1/policy_pb.js";
import { type Rational, add, compare, decimalString, parseDecimal } from "./exact.js";
import { PolicyError, TrustStore, type VerifiedPolicy, fromHex, hex, verifyPolicy } from "./policy.js";
import { ReportIds, coarseTime, reportBytes, submitRequestBytes } from "./wire.js";
import { MemoState, encodeValue } from "./mechanisms.js";

export interface ClientOptions {
  /** host:port of the collector's gRPC endpoint. */
  collector: string;
  /** Bearer token (sent as `authorization: Bearer <token>`). */
  token: string;
  /** Raw 32-byte root public keys this device pins. */
  pinnedRootKeys: Uint8Array[];
  /** A serialized root SignedEnvelope signed by the pinned keys. */
  rootEnvelope: Uint8Array;
  /** The device state file (outbox, spend, versions); created if missing. */
  stateFile: string;
  /** The device's own ceiling on any one report's charge (decimal string). */
  maxEpsilon?: string;
  /** Plaintext gRPC (loopback tests, a TLS-terminating sidecar); TLS otherwise. */
  insecure?: boolean;
  batchSize?: number;
  /** Unix seconds (tests); the system clock by default. */
  now?: () => bigint;
}

interface Pending { id: string; report: string }
interface State {
  format: "fedldp.js.state.v1";
  pending: Pending[];
  spent: Record<string, string>;
  highestVersions: Record<string, string>;
  pausedUntilMs: number;
  failures: number;
  /** Memo state (permanent responses) of memoized metrics, by metric name: MemoState JSON. */
  memos?: Record<string, string>;
}

/** record() refused by the on-device budget guard: nothing randomized, nothing stored. */
export class BudgetExhaustedError extends Error {}
/** No verified policy collects this metric. */
export class NoPolicyError extends Error {}

export interface FlushResult { accepted: number; duplicate: number; refused: number; pending: number; pausedMs: number }

const SUBMIT = "/fedldp.v1.Collector/Submit";
const GET_POLICIES = "/fedldp.v1.Collector/GetPolicies";

function emptyState(): State {
  return { format: "fedldp.js.state.v1", pending: [], spent: {}, highestVersions: {}, pausedUntilMs: 0, failures: 0 };
}

/** The device client (one per state file). */
export class FedldpClient {
  private policies = new Map<string, VerifiedPolicy>();
  private readonly ids = new ReportIds();
  private readonly grpcClient: grpc.Client;
  private readonly metadata = new grpc.Metadata();
  private queue: Promise<unknown> = Promise.resolve();

  private constructor(private readonly options: ClientOptions, private trust: TrustStore, private state: State) {
    const credentials = options.insecure ? grpc.credentials.createInsecure() : grpc.credentials.createSsl();
    this.grpcClient = new grpc.Client(options.collector, credentials);
    this.metadata.set("authorization", `Bearer ${options.token}`);
  }

  /** Open (or create) the state file, trust the pinned root and fetch the policies. */
  static async open(options: ClientOptions): Promise<FedldpClient> {
    const trust = await TrustStore.fromPinnedRoot(options.rootEnvelope, options.pinnedRootKeys);
    let state = emptyState();
    try {
      state = JSON.parse(await fs.readFile(options.stateFile, "utf8")) as State;
      if (state.format !== "fedldp.js.state.v1") throw new Error("unknown state file format");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
    }
    const client = new FedldpClient(options, trust, state);
    await client.refreshPolicies();
    return client;
  }

  private now(): bigint {
    return this.options.now ? this.options.now() : BigInt(Math.floor(Date.now() / 1000));
  }

  private call<T>(method: string, request: Uint8Array, decode: (b: Buffer) => T): Promise<T> {
    return new Promise((resolve, reject) => {
      this.grpcClient.makeUnaryRequest(
        method, (x: Uint8Array) => Buffer.from(x), decode, request, this.metadata,
        { deadline: Date.now() + 10_000 },
        (error, response) => (error || response === undefined ? reject(error) : resolve(response)));
    });
  }

  /** GetPolicies: apply newer roots, verify every envelope, keep the highest version per metric. */
  async refreshPolicies(): Promise<void> {
    const request = toBinary(GetPoliciesRequestSchema, create(GetPoliciesRequestSchema, {
      knownRootVersion: this.trust.rootVersion,
    }));
    const response = await this.call(GET_POLICIES, request, (b) => fromBinary(GetPoliciesResponseSchema, b));
    await this.trust.updateRoots(response.roots.map((e) => toBinary(SignedEnvelopeSchema, e)));
    const highest: Record<string, bigint> = {};
    for (const [id, v] of Object.entries(this.state.highestVersions)) highest[id] = BigInt(v);
    const policies = new Map<string, VerifiedPolicy>();
    const maxEpsilon = this.options.maxEpsilon === undefined ? undefined : parseDecimal(this.options.maxEpsilon);
    for (const envelope of response.policies) {
      try {
        const verified = await verifyPolicy(toBinary(SignedEnvelopeSchema, envelope), this.trust, {
          now: this.now(), highestVersions: highest, ...(maxEpsilon ? { maxEpsilon } : {}),
        });
        const known = policies.get(verified.metricName);
        if (known === undefined || known.version < verified.version) policies.set(verified.metricName, verified);
      } catch (error) {
        if (!(error instanceof PolicyError)) throw error; // a refused policy is skipped
      }
    }
    for (const p of policies.values()) this.state.highestVersions[p.policyId] = p.version.toString();
    this.policies = policies;
    await this.persist();
  }

  /** The verified policy collecting `metric`, if any. */
  policy(metric: string): VerifiedPolicy | undefined {
    return this.policies.get(metric);
  }

  private serial<T>(task: () => Promise<T>): Promise<T> {
    const run = this.queue.then(task, task);
    this.queue = run.catch(() => undefined);
    return run;
  }

  /**
   * Randomize `value` under the metric's policy (a label of a categorical metric, a number
   * of a numeric one, a string of an open-domain one, an array or object of attribute
   * values of a multi-attribute one: `encodeValue`) and store the report durably (not sent
   * yet), with the memo state of a memoized mechanism in the same atomic write.
   */
  record(metric: string, value: string | number | readonly unknown[] | Record<string, unknown>): Promise<void> {
    return this.serial(async () => {
      const policy = this.policies.get(metric);
      if (policy === undefined) throw new NoPolicyError(`no verified policy collects metric ${metric}`);
      let input: ReturnType<typeof encodeValue>;
      try {
        input = encodeValue(policy.mechanism, policy.labels, value);
      } catch (error) {
        throw new RangeError(`policy ${policy.policyId} v${policy.version}: ${(error as Error).message}`);
      }
      const now = this.now();
      const window = now - (now % policy.windowSeconds);
      const key = `${policy.policyId}@${window}`;
      const spent = this.state.spent[key] ?? "0";
      const after = add(parseDecimal(spent), policy.charge);
      if (compare(after, policy.epsilonCap) > 0) {
        throw new BudgetExhaustedError(`policy ${policy.policyId}: this window's budget is spent (cap ${decimalString(policy.epsilonCap)})`);
      }
      const memo = this.memoFor(metric, policy);
      const output = policy.mechanism.perturb(input, undefined, memo);
      const reportId = this.ids.next();
      const bytes = reportBytes({
        reportId, policyId: policy.policyId, policyVersion: policy.version,
        policyDigest: policy.digest, coarseTime: coarseTime(now),
      }, output);
      this.state.spent[key] = decimalString(after);
      if (memo !== undefined) (this.state.memos ??= {})[metric] = memo.toJSON();
      this.state.pending.push({ id: hex(reportId), report: hex(bytes) });
      await this.persist();
    });
  }

  /** The stored memo of a memoized policy's metric (a fresh one when absent or bound to other parameters). */
  private memoFor(metric: string, policy: VerifiedPolicy): MemoState | undefined {
    const fresh = policy.mechanism.newMemo;
    if (!policy.mechanism.memoized || fresh === undefined) return undefined;
    const text = this.state.memos?.[metric];
    const stored = text === undefined ? undefined : MemoState.fromJSON(text);
    const memo = fresh.call(policy.mechanism);
    return stored !== undefined && stored.key === memo.key ? stored : memo;
  }

  /** Send every pending report (same bytes on every attempt); honours the retry hint. */
  flush(): Promise<FlushResult> {
    return this.serial(async () => {
      const result: FlushResult = { accepted: 0, duplicate: 0, refused: 0, pending: 0, pausedMs: 0 };
      const batchSize = this.options.batchSize ?? 100;
      while (this.state.pending.length > 0) {
        const wait = this.state.pausedUntilMs - Date.now();
        if (wait > 0) {
          result.pausedMs = wait;
          break;
        }
        const batch = this.state.pending.slice(0, batchSize);
        let response: SubmitResponse;
        try {
          response = await this.call(SUBMIT, submitRequestBytes(batch.map((p) => fromHex(p.report))),
            (b) => fromBinary(SubmitResponseSchema, b));
        } catch (error) {
          this.failed(error as grpc.ServiceError);
          await this.persist();
          continue;
        }
        this.state.failures = 0;
        const done = new Set<string>();
        for (const outcome of response.outcomes) {
          done.add(hex(outcome.reportId));
          if (outcome.outcome === Outcome.ACCEPTED) result.accepted += 1;
          else if (outcome.outcome === Outcome.DUPLICATE) result.duplicate += 1;
          else result.refused += 1;
        }
        this.state.pending = this.state.pending.filter((p) => !done.has(p.id));
        await this.persist();
        if (done.size === 0) break;
      }
      result.pending = this.state.pending.length;
      return result;
    });
  }

  /** A failed call: pause for the server's retry-after-ms hint, else exponential backoff with jitter. */
  private failed(error: grpc.ServiceError): void {
    this.state.failures += 1;
    const hint = error.metadata?.get("retry-after-ms")?.[0];
    const hintMs = hint === undefined ? NaN : Number(hint.toString());
    const backoff = Math.random() * Math.min(60_000, 500 * 2 ** Math.min(this.state.failures, 10));
    const pause = Number.isFinite(hintMs) ? Math.min(hintMs, 300_000) : backoff;
    this.state.pausedUntilMs = Date.now() + pause;
  }

  /** End a pause now (connectivity came back); a server hint still in force is kept. */
  wake(): void {
    if (this.state.failures > 0) this.state.pausedUntilMs = 0;
  }

  /** Persist and close the channel (pending reports stay in the state file for the next open). */
  close(): Promise<void> {
    return this.serial(async () => {
      await this.persist();
      this.grpcClient.close();
    });
  }

  /** Pending reports (ids and exact bytes, hex): for tests and diagnostics. */
  pendingReports(): ReadonlyArray<Pending> {
    return this.state.pending.map((p) => ({ ...p }));
  }

  private async persist(): Promise<void> {
    const file = this.options.stateFile;
    const temporary = `${file}.tmp`;
    const handle = await fs.open(temporary, "w", 0o600);
    try {
      await handle.writeFile(JSON.stringify(this.state));
      await handle.sync();
    } finally {
      await handle.close();
    }
    await fs.rename(temporary, file);
    const folder = await fs.open(path.dirname(file), "r");
    try {
      await folder.sync();
    } finally {
      await folder.close();
    }
  }
}

export type { Rational };
