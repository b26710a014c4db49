/**
 * The device's durable state — the outbox of reports not yet acknowledged (their
 * ids and exact bytes, hex), spend per (policy id, window start), the highest
 * policy versions seen and the retry pause — and where it is kept: a file in Node
 * (outbox_file.ts), IndexedDB in browsers (outbox_indexeddb.ts). It holds
 * randomized outputs only, never a raw value (memoized responses are keyed by a
 * keyed hash of the value: memo_store.ts). `save` returns once the state is
 * durable (the file synced and renamed; the IndexedDB transaction complete).
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

export interface StateStore {
  /** The stored state, or undefined when there is none yet. */
  load(): Promise<State | undefined>;
  /** Replace the stored state durably. */
  save(state: State): Promise<void>;
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
