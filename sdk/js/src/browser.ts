/**
 * The browser entry (ESM; bundled by scripts/build_browser.mjs): a client over the
 * collector's web endpoint (Connect protocol by default, or gRPC-Web, with
 * @connectrpc/connect-web and fetch), its outbox in IndexedDB. Randomness from
 * crypto.getRandomValues, Ed25519 through WebCrypto where available.
 */
import { type CoreOptions, FedldpClient } from "./client.js";
import { IndexedDBStore } from "./outbox_indexeddb.js";
import { ConnectTransport } from "./transport_connect.js";

export interface BrowserClientOptions extends CoreOptions {
  /** Base URL of the collector's web endpoint, e.g. https://collector.example.com:8443 */
  collectorUrl: string;
  /** Bearer token (sent as `authorization: Bearer <token>`). */
  token: string;
  /** "connect" (default) or "grpc-web". */
  protocol?: "connect" | "grpc-web";
  /** IndexedDB database name (default "fedldp"). */
  database?: string;
  /** IndexedDB durability of each save: "strict" (default, flushed to disk) or "relaxed". */
  durability?: "strict" | "relaxed";
}

/** Open (or create) the IndexedDB outbox, trust the pinned root and fetch the policies. */
export async function openBrowserClient(options: BrowserClientOptions): Promise<FedldpClient> {
  const store = await IndexedDBStore.open(options.database ?? "fedldp", options.durability ?? "strict");
  const transport = new ConnectTransport({ baseUrl: options.collectorUrl, token: options.token, protocol: options.protocol ?? "connect" });
  return FedldpClient.open({ ...options, store, transport });
}

export { FedldpClient, BudgetExhaustedError, NoPolicyError } from "./client.js";
export type { CoreOptions, FlushResult } from "./client.js";
export { IndexedDBStore } from "./outbox_indexeddb.js";
export { ConnectTransport } from "./transport_connect.js";
export { TransportError } from "./transport.js";
export { fromHex, hex, PolicyError } from "./policy.js";
