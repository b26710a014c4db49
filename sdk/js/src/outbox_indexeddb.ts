/**
 * The device state in IndexedDB (browsers): one record in object store "state" of
 * database `name` (default "fedldp"), replaced in a "readwrite" transaction with
 * durability "strict" where the browser supports it; `save` resolves when the
 * transaction completes (committed), so a report is durable before record()
 * returns. Origin-scoped like all IndexedDB data.
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
  private constructor(private readonly db: IDBDatabase) {}

  /** Open (creating if needed) database `name`. */
  static async open(name = "fedldp", factory: IDBFactory = globalThis.indexedDB): Promise<IndexedDBStore> {
    if (factory === undefined) throw new Error("IndexedDB is not available here");
    const opening = factory.open(name, 1);
    opening.onupgradeneeded = () => {
      if (!opening.result.objectStoreNames.contains(STORE)) opening.result.createObjectStore(STORE);
    };
    return new IndexedDBStore(await request(opening));
  }

  async load(): Promise<State | undefined> {
    const tx = this.db.transaction(STORE, "readonly");
    const value: unknown = await request(tx.objectStore(STORE).get(KEY));
    return value === undefined ? undefined : checkState(value);
  }

  save(state: State): Promise<void> {
    return new Promise((resolve, reject) => {
      const tx = this.db.transaction(STORE, "readwrite", { durability: "strict" });
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
