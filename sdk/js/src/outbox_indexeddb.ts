/**
 * The device state in IndexedDB (browsers), database `name` (default "fedldp"), version 2:
 * object store "state" holds the full State under key "device"; object store "log"
 * (auto-increment keys) the Changes (outbox.ts) made since, applied in key order at
 * `load`. record() is one put of its Change (the report, its window's spend, the memo
 * rows it drew) into "log" in one readwrite transaction — stored together or not at all —
 * and resolves when the transaction completes, so a report is stored before record()
 * returns. Durability "strict" (default: the browser flushes to disk before `complete`)
 * or "relaxed" (committed, not yet flushed: survives a tab or browser crash, not an OS
 * crash or power loss). `save` (and an `append` once the log holds more changes than
 * max(128, twice the outbox at the last save)) puts the full state and clears "log" in
 * one transaction (compaction). A version-1 database (the full state only) is upgraded in
 * place: its state is read as is, with an empty log. Origin-scoped like all IndexedDB data.
 */
import { type Change, type State, type StateStore, applyChange, checkState, withChange } from "./outbox.js";

const STORE = "state";
const LOG = "log";
const KEY = "device";
const COMPACT_MIN_CHANGES = 128;

function request<T>(r: IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    r.onsuccess = () => resolve(r.result);
    r.onerror = () => reject(r.error);
  });
}

function completion(tx: IDBTransaction): Promise<void> {
  return new Promise((resolve, reject) => {
    tx.oncomplete = () => resolve();
    tx.onerror = () => reject(tx.error);
    tx.onabort = () => reject(tx.error ?? new Error("IndexedDB transaction aborted"));
  });
}

export class IndexedDBStore implements StateStore {
  /** Changes in "log" (counted at load, save and append) and the outbox size at the last save. */
  private changes = -1;
  private pendingAtSave = 0;

  private constructor(private readonly db: IDBDatabase, private readonly durability: IDBTransactionDurability) {}

  /** Open (creating or upgrading if needed) database `name`. */
  static async open(
    name = "fedldp", durability: "strict" | "relaxed" = "strict", factory: IDBFactory = globalThis.indexedDB,
  ): Promise<IndexedDBStore> {
    if (factory === undefined) throw new Error("IndexedDB is not available here");
    const opening = factory.open(name, 2);
    opening.onupgradeneeded = () => {
      const db = opening.result;
      if (!db.objectStoreNames.contains(STORE)) db.createObjectStore(STORE);
      if (!db.objectStoreNames.contains(LOG)) db.createObjectStore(LOG, { autoIncrement: true });
    };
    return new IndexedDBStore(await request(opening), durability);
  }

  async load(): Promise<State | undefined> {
    const tx = this.db.transaction([STORE, LOG], "readonly");
    const [value, changes] = await Promise.all([
      request(tx.objectStore(STORE).get(KEY)) as Promise<unknown>,
      request(tx.objectStore(LOG).getAll()) as Promise<Change[]>,
    ]);
    if (value === undefined) return undefined;
    const state = checkState(value);
    for (const change of changes) applyChange(state, change);
    this.changes = changes.length;
    this.pendingAtSave = state.pending.length;
    return state;
  }

  /** The full state put and the log cleared, in one transaction (compaction). */
  save(state: State): Promise<void> {
    const tx = this.db.transaction([STORE, LOG], "readwrite", { durability: this.durability });
    tx.objectStore(STORE).put(state, KEY);
    tx.objectStore(LOG).clear();
    tx.commit?.();
    this.changes = 0;
    this.pendingAtSave = state.pending.length;
    return completion(tx);
  }

  /** One put of `change` into "log" (or a compaction when the log outgrew the state). */
  append(state: State, change: Change): Promise<void> {
    if (this.changes < 0 || this.changes >= Math.max(COMPACT_MIN_CHANGES, 2 * this.pendingAtSave)) return this.save(withChange(state, change));
    const tx = this.db.transaction(LOG, "readwrite", { durability: this.durability });
    tx.objectStore(LOG).add(change);
    tx.commit?.(); // commit with the request, not after its answer came back to the page: one round trip
    this.changes += 1;
    return completion(tx);
  }

  close(): void {
    this.db.close();
  }
}
