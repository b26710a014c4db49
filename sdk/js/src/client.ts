/**
 * The device client: verified policies, record() into a durable outbox, flush()
 * to the collector, the on-device budget guard and the collector's retry hint.
 * Platform-neutral: the outbox (a StateStore: a file in Node, IndexedDB in
 * browsers) and the transport (gRPC in Node, Connect or gRPC-Web over fetch in
 * browsers) are passed in; node.ts and browser.ts build them.
 *
 * record(metric, label) randomizes once and stores the report's exact bytes (and
 * its id) durably before it returns; flush() resends those same bytes until the
 * collector answers, so a retry after a crash or a lost answer carries the same
 * report id and is charged once (DUPLICATE). The state holds report bytes
 * (randomized outputs), spend per (policy id, window start) and the highest
 * policy versions; never a raw value. Errors and logs never include the value.
 */
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import {
  GetPoliciesRequestSchema, GetPoliciesResponseSchema, Outcome, SubmitResponseSchema,
  type SubmitResponse,
} from "./gen/fedldp/v1/collector_pb.js";
import { SignedEnvelopeSchema } from "./gen/fedldp/v1/policy_pb.js";
import { type Rational, add, compare, decimalString, parseDecimal } from "./exact.js";
import { type Change, type Pending, type State, type StateStore, applyChange, emptyState, withChange } from "./outbox.js";
import { PolicyError, TrustStore, type VerifiedPolicy, fromHex, hex, verifyPolicy } from "./policy.js";
import { type CollectorTransport, TransportError } from "./transport.js";
import { ReportIds, coarseTime, reportBytes, sealedReportBytes, submitRequestBytes } from "./wire.js";
import { type Input, MemoState, encodeValue } from "./mechanisms.js";
import { type MemoRows, loadSlots, migrateMemos, newMemoSecret, saveSlots } from "./memo_store.js";

export interface CoreOptions {
  /** Raw 32-byte root public keys this device pins. */
  pinnedRootKeys: Uint8Array[];
  /** A serialized root SignedEnvelope signed by the pinned keys. */
  rootEnvelope: Uint8Array;
  /** The device's own ceiling on any one report's charge (decimal string). */
  maxEpsilon?: string;
  batchSize?: number;
  /** Unix seconds (tests); the system clock by default. */
  now?: () => bigint;
}

export interface ClientParts extends CoreOptions {
  /** Where the outbox and budget state are kept. */
  store: StateStore;
  /** How the collector is reached. */
  transport: CollectorTransport;
}

/** record() refused by the on-device budget guard: nothing randomized, nothing stored. */
export class BudgetExhaustedError extends Error {}
/** No verified policy collects this metric. */
export class NoPolicyError extends Error {}

/** client/transport.py Backoff: base_seconds, max_seconds, max_hint_seconds (in ms). */
const BACKOFF_BASE_MS = 500;
const BACKOFF_MAX_MS = 300_000;
const MAX_HINT_MS = 3_600_000;

export interface FlushResult { accepted: number; duplicate: number; refused: number; pending: number; pausedMs: number }

/** The device client (one per outbox). */
export class FedldpClient {
  private policies = new Map<string, VerifiedPolicy>();
  private readonly ids = new ReportIds();
  private queue: Promise<unknown> = Promise.resolve();
  private lastFailure: TransportError | undefined;

  private constructor(private readonly options: ClientParts, private trust: TrustStore, private state: State) {}

  /** Load the stored state, trust the pinned root and fetch the policies. */
  static async open(options: ClientParts): Promise<FedldpClient> {
    const configured = await TrustStore.fromPinnedRoot(options.rootEnvelope, options.pinnedRootKeys);
    const state = (await options.store.load()) ?? emptyState();
    const trust = (await storedTrust(state, options.pinnedRootKeys, configured)) ?? configured;
    if (state.memos !== undefined) {
      state.memoSecret ??= newMemoSecret();
      migrateMemos(state.memos, (state.memoRows ??= {}), state.memoSecret);
      delete state.memos;
    }
    const client = new FedldpClient(options, trust, state);
    await client.refreshPolicies();
    return client;
  }

  private now(): bigint {
    return this.options.now ? this.options.now() : BigInt(Math.floor(Date.now() / 1000));
  }

  /** GetPolicies: apply newer roots, verify every envelope, keep the highest version per metric. */
  async refreshPolicies(): Promise<void> {
    const request = toBinary(GetPoliciesRequestSchema, create(GetPoliciesRequestSchema, {
      knownRootVersion: this.trust.rootVersion,
    }));
    const response = fromBinary(GetPoliciesResponseSchema, await this.options.transport.call("GetPolicies", request));
    await this.trust.updateRoots(response.roots.map((e) => toBinary(SignedEnvelopeSchema, e)));
    this.state.trust = { pinned: pinnedHex(this.options.pinnedRootKeys), root: hex(this.trust.rootEnvelope) };
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
      const change: Change = { spent: [key, decimalString(after)] };
      const output = this.perturb(metric, policy, input, change);
      const reportId = this.ids.next();
      const header = {
        reportId, policyId: policy.policyId, policyVersion: policy.version,
        policyDigest: policy.digest, coarseTime: coarseTime(now),
      };
      // A shuffle-model policy: the outbox holds the report with its payload sealed to the
      // analyzer (sealed.ts and the HPKE code are loaded on the first such record only).
      const bytes = policy.analyzerPublicKey === undefined
        ? reportBytes(header, output)
        : await sealedReportBytes(header, output, policy.analyzerPublicKey);
      change.add = { id: hex(reportId), report: hex(bytes) };
      await this.commit(change);
    });
  }

  /**
   * One report of `input`; for a memoized mechanism (Erlingsson et al., CCS 2014, Section 3)
   * the slots it names (memoSlots) are loaded from the keyed memo rows of (metric, memo key)
   * and the slots drawn for the first time saved back into `change` (persisted with the
   * report, in the same durable write), as the Python SDK's recorder does.
   */
  private perturb(
    metric: string, policy: VerifiedPolicy, input: Input, change: Change,
  ): ReturnType<VerifiedPolicy["mechanism"]["perturb"]> {
    const mechanism = policy.mechanism;
    if (!mechanism.memoized) return mechanism.perturb(input);
    if (mechanism.newMemo === undefined || mechanism.memoSlots === undefined) {
      throw new Error(`${policy.policyId}: a memoized mechanism must name its memo slots`); // never redraw silently
    }
    const memo: MemoState = mechanism.newMemo();
    if (this.state.memoSecret === undefined) change.memoSecret = newMemoSecret();
    const secret = change.memoSecret ?? this.state.memoSecret!;
    const rows: MemoRows = this.state.memoRows ?? {}; // read here; written by commit(change)
    const loaded = new Set<number>();
    for (;;) {
      const wanted = mechanism.memoSlots(input, memo).filter((slot) => !loaded.has(slot));
      if (wanted.length === 0) break;
      for (const slot of wanted) loaded.add(slot);
      loadSlots(rows, secret, metric, memo, wanted);
    }
    const before = new Set(memo.responses.keys());
    const output = mechanism.perturb(input, undefined, memo);
    change.memo = saveSlots({}, secret, metric, memo, [...memo.responses.keys()].filter((slot) => !before.has(slot)));
    return output;
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
          const bytes = await this.options.transport.call("Submit", submitRequestBytes(batch.map((p) => fromHex(p.report))));
          response = fromBinary(SubmitResponseSchema, bytes);
        } catch (error) {
          if (!(error instanceof TransportError)) throw error;
          this.failed(error);
          await this.commit({ retry: this.retryState() });
          result.pausedMs = Math.max(0, this.state.pausedUntilMs - Date.now());
          break; // a failed call ends this flush: the next attempt waits for the pause

        }
        this.state.failures = 0;
        const done = new Set<string>();
        for (const outcome of response.outcomes) {
          done.add(hex(outcome.reportId));
          if (outcome.outcome === Outcome.ACCEPTED) result.accepted += 1;
          else if (outcome.outcome === Outcome.DUPLICATE) result.duplicate += 1;
          else result.refused += 1;
        }
        await this.commit({ remove: [...done], retry: this.retryState() });
        if (done.size === 0) break;
      }
      result.pending = this.state.pending.length;
      return result;
    });
  }

  /**
   * A failed call: pause for exponential backoff with full jitter (Brooker 2015), raised to
   * the server's retry-after-ms hint when one came (capped), as the Python SDK's Backoff.delay
   * (client/transport.py): uniform(0, min(300 s, 500 ms × 2^(failures−1))), then max with
   * min(hint, 3600 s). The hint is a floor on the pause, never its replacement, so a hint of
   * 0 still backs off; flush() makes no further call until the pause ends.
   */
  private failed(error: TransportError): void {
    this.lastFailure = error;
    this.state.failures += 1;
    const hintMs = error.retryAfterMs ?? NaN;
    const ceiling = Math.min(BACKOFF_MAX_MS, BACKOFF_BASE_MS * 2 ** Math.min(this.state.failures - 1, 30));
    const backoff = Math.random() * ceiling;
    const hinted = Number.isFinite(hintMs) && hintMs >= 0;
    const pause = hinted ? Math.max(backoff, Math.min(hintMs, MAX_HINT_MS)) : backoff;
    const now = Date.now();
    if (hinted) this.state.hintUntilMs = now + Math.min(hintMs, MAX_HINT_MS);
    this.state.pausedUntilMs = now + pause;
  }

  /** End a pause now (connectivity came back); a server hint still in force is kept. */
  wake(): void {
    if (this.state.failures > 0) this.state.pausedUntilMs = Math.max(0, this.state.hintUntilMs ?? 0);
  }

  /** The last failed call's status (code name and retry hint), for diagnostics. */
  lastError(): TransportError | undefined {
    return this.lastFailure;
  }

  /** Persist and close the transport and store (pending reports stay for the next open). */
  close(): Promise<void> {
    return this.serial(async () => {
      await this.persist();
      this.options.transport.close();
      this.options.store.close();
    });
  }

  /** Pending reports (ids and exact bytes, hex): for tests and diagnostics. */
  pendingReports(): ReadonlyArray<Pending> {
    return this.state.pending.map((p) => ({ ...p }));
  }

  private persist(): Promise<void> {
    return this.options.store.save(this.state);
  }

  /**
   * Make `change` durable — the store's `append` (one small write), or a full save for a
   * store without one — then apply it to the state: a write that fails changes nothing
   * (the report is not pending, its spend and memo rows are not counted).
   */
  private async commit(change: Change): Promise<void> {
    const store = this.options.store;
    if (store.append) await store.append(this.state, change);
    else await store.save(withChange(this.state, change));
    applyChange(this.state, change);
  }

  /** The retry fields of the state (a Change's `retry`). */
  private retryState(): NonNullable<Change["retry"]> {
    const { failures, pausedUntilMs, hintUntilMs } = this.state;
    return hintUntilMs === undefined ? { failures, pausedUntilMs } : { failures, pausedUntilMs, hintUntilMs };
  }
}

/** The pinned root keys as stored (hex, sorted, distinct). */
function pinnedHex(keys: Uint8Array[]): string[] {
  return [...new Set(keys.map(hex))].sort();
}

/**
 * The stored trust if it follows the configured pins and is not older than the configured
 * root, else undefined (policy_cache.py _stored_trust): a rotation reached earlier holds
 * after a restart, an app update with new pins or a newer bundled root starts from those.
 * A stored root that no longer verifies is ignored (the configured trust is used).
 */
async function storedTrust(state: State, pinned: Uint8Array[], configured: TrustStore): Promise<TrustStore | undefined> {
  const stored = state.trust;
  if (stored === undefined || JSON.stringify(stored.pinned) !== JSON.stringify(pinnedHex(pinned))) return undefined;
  let trust: TrustStore;
  try {
    trust = await TrustStore.fromStoredRoot(fromHex(stored.root));
  } catch (error) {
    if (error instanceof PolicyError || error instanceof RangeError || error instanceof TypeError) return undefined;
    throw error;
  }
  return trust.rootVersion >= configured.rootVersion ? trust : undefined;
}

export type { Rational };
