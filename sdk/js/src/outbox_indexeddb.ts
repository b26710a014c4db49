/**
 * The device state in IndexedDB (browsers): one record in object store "state" of
 * database `name` (default "fedldp"), replaced in a "readwrite" transaction with
 * durability "strict" (default: the browser flushes to disk before `complete`)
 * or "relaxed" (committed, not yet flushed: survives a tab or browser crash, not
 * an OS crash or power loss); `save` resolves when the transaction completes, so
 * a report is stored before record() returns. Origin-scoped like all IndexedDB data.
 */
import { type State, type StateStore, checkState } from "./outbox.js";

const STORE = "state";
const KEY = "device";

function request<T>(r: IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    r.onsuccess = () => resolve(r.result);
    r.onerror = () => reject(r.error);
  });
}

export class IndexedDBStore implements StateStore {
  private constructor(private readonly db: IDBDatabase, private readonly durability: IDBTransactionDurability) {}

  /** Open (creating if needed) database `name`. */
  static async open(
    name = "fedldp", durability: "strict" | "relaxed" = "strict", factory: IDBFactory = globalThis.indexedDB,
  ): Promise<IndexedDBStore> {
    if (factory === undefined) throw new Error("IndexedDB is not available here");
    const opening = factory.open(name, 1);
    opening.onupgradeneeded = () => {
      if (!opening.result.objectStoreNames.contains(STORE)) opening.result.createObjectStore(STORE);
    };
    return new IndexedDBStore(await request(opening), durability);
  }

  async load(): Promise<State | undefined> {
    const tx = this.db.transaction(STORE, "readonly");
    const value: unknown = await request(tx.objectStore(STORE).get(KEY));
    return value === undefined ? undefined : checkState(value);
  }

  save(state: State): Promise<void> {
    return new Promise((resolve, reject) => {
      const tx = this.db.transaction(STORE, "readwrite", { durability: this.durability });
      tx.objectStore(STORE).put(structuredClone(state), KEY);
      tx.oncomplete = () => resolve();
      tx.onerror = () => reject(tx.error);
      tx.onabort = () => reject(tx.error ?? new Error("IndexedDB transaction aborted"));
    });
  }

  close(): void {
    this.db.close();
  }
}
