/**
 * The device's durable state — the outbox of reports not yet acknowledged (their
 * ids and exact bytes, hex), spend per (policy id, window start), the highest
 * policy versions seen and the retry pause — and where it is kept: a file in Node
 * (outbox_file.ts), IndexedDB in browsers (outbox_indexeddb.ts). It holds
 * randomized outputs only, never a raw value (memoized responses are keyed by a
 * keyed hash of the value: memo_store.ts). `save` returns once the state is
 * durable (the file synced and renamed; the IndexedDB transaction complete).
 *
 * record() does not rewrite the state: it hands the store a small Change (the report,
 * the new spend of its window, the memo rows first drawn) that `append` makes durable
 * on its own — one framed, checksummed record appended to the file and fdatasync'd
 * (outbox_file.ts), one put into the "log" object store of IndexedDB (outbox_indexeddb.ts)
 * — so a report, its budget charge and its memo state are stored together or not at
 * all. `load` replays the changes over the last full state; the store rewrites the
 * full state (compaction) when the changes outgrow it.
 */
import { type MemoRows } from "./memo_store.js";

export interface Pending { id: string; report: string }

export interface State {
  format: "fedldp.js.state.v1";
  pending: Pending[];
  spent: Record<string, string>;
  highestVersions: Record<string, string>;
  pausedUntilMs: number;
  /** The end of the collector's last retry-after-ms hint (Unix ms): wake() does not end a pause before it. */
  hintUntilMs?: number;
  failures: number;
  /**
   * Permanent responses of memoized metrics: metric -> memo key -> HMAC-SHA256 of the
   * slot under `memoSecret` (hex) -> response (hex); memo_store.ts. Never a value index.
   */
  memoRows?: MemoRows;
  /** The device-local memo secret (hex, 32 bytes), made on first use and never changed. */
  memoSecret?: string;
  /**
   * The trust reached (the Python SDK's trust table): the pinned root keys it follows
   * (hex, sorted) and the highest root envelope verified (hex). Used at open instead of the
   * configured root when the pins are the same and its version is not lower.
   */
  trust?: { pinned: string[]; root: string };
  /** The earlier layout (MemoState JSON by metric, keyed by value index): re-keyed into memoRows at open. */
  memos?: Record<string, string>;
}

/**
 * One durable step of the state, as `applyChange` applies it: a report recorded (`add`,
 * with its window's new spend and the memo rows it drew first), reports acknowledged
 * (`remove`), the retry pause after a call (`retry`). Randomized outputs only.
 */
export interface Change {
  /** A report recorded: appended to the outbox. */
  add?: Pending;
  /** Ids (hex) of reports the collector answered: removed from the outbox. */
  remove?: string[];
  /** The new spend of one (policy id @ window start) key. */
  spent?: [key: string, total: string];
  /** Memo rows drawn for the first time: [metric, memo key, keyed slot digest, response hex]. */
  memo?: [string, string, string, string][];
  /** The memo secret, when this change made it. */
  memoSecret?: string;
  /** The retry state after a call. */
  retry?: { failures: number; pausedUntilMs: number; hintUntilMs?: number };
}

export interface StateStore {
  /** The stored state, or undefined when there is none yet. */
  load(): Promise<State | undefined>;
  /** Replace the stored state durably. */
  save(state: State): Promise<void>;
  /**
   * Make `change` durable; `state` is the state before it (a store may write
   * `withChange(state, change)` whole instead, to compact). The client applies `change` to
   * its own state only once this resolves, so a failed write changes nothing. A store
   * without `append` gets `save(withChange(state, change))`.
   */
  append?(state: State, change: Change): Promise<void>;
  /** Release the store (a database connection). */
  close(): void;
}

/** A device's state before anything was recorded. */
export function emptyState(): State {
  return { format: "fedldp.js.state.v1", pending: [], spent: {}, highestVersions: {}, pausedUntilMs: 0, failures: 0 };
}

/** `value` as a State (an Error naming what is wrong otherwise). */
export function checkState(value: unknown): State {
  const state = value as State;
  if (typeof state !== "object" || state === null || state.format !== "fedldp.js.state.v1" || !Array.isArray(state.pending)) {
    throw new Error("unknown device state format");
  }
  return state;
}

/** Apply `change` to `state` in place (the client after record/flush; a store replaying its log). */
export function applyChange(state: State, change: Change): void {
  if (change.memoSecret !== undefined) state.memoSecret = change.memoSecret;
  if (change.spent !== undefined) state.spent[change.spent[0]] = change.spent[1];
  for (const [metric, key, slot, response] of change.memo ?? []) {
    (((state.memoRows ??= {})[metric] ??= {})[key] ??= {})[slot] = response;
  }
  if (change.add !== undefined) state.pending.push({ id: change.add.id, report: change.add.report });
  if (change.remove !== undefined && change.remove.length > 0) {
    const done = new Set(change.remove);
    state.pending = state.pending.filter((p) => !done.has(p.id));
  }
  if (change.retry !== undefined) {
    state.failures = change.retry.failures;
    state.pausedUntilMs = change.retry.pausedUntilMs;
    if (change.retry.hintUntilMs === undefined) delete state.hintUntilMs;
    else state.hintUntilMs = change.retry.hintUntilMs;
  }
}

/** A copy of `state` with `change` applied (`state` is left as it is). */
export function withChange(state: State, change: Change): State {
  const next = structuredClone(state);
  applyChange(next, change);
  return next;
}
