/**
 * How the client reaches the collector: one unary call of raw request bytes to raw
 * response bytes. Implementations: gRPC over HTTP/2 in Node (transport_grpc.ts,
 * @grpc/grpc-js) and the Connect protocol or gRPC-Web over fetch in browsers and
 * Node (transport_connect.ts, @connectrpc/connect-web), against the collector's
 * web endpoint. A failed call rejects with TransportError: the status code's name
 * (as gRPC spells it), the collector's message and its retry hint, if any.
 */

/** The Collector RPCs the device calls. */
export type CollectorMethod = "Submit" | "GetPolicies";

/** A call that did not return a response. */
export class TransportError extends Error {
  constructor(
    message: string,
    /** gRPC status code name, e.g. RESOURCE_EXHAUSTED, UNAUTHENTICATED, UNAVAILABLE. */
    readonly code: string,
    /** The collector's `retry-after-ms` hint, when it sent one. */
    readonly retryAfterMs?: number,
  ) {
    super(message);
    this.name = "TransportError";
  }
}

export interface CollectorTransport {
  /** Send `request` (a serialized request message) and resolve with the response bytes. */
  call(method: CollectorMethod, request: Uint8Array): Promise<Uint8Array>;
  /** Release connections. */
  close(): void;
}

/** The retry hint's milliseconds from a header or trailer value (undefined when absent or not a number). */
export function retryHint(value: string | undefined | null): number | undefined {
  if (value === undefined || value === null) return undefined;
  const ms = Number(value);
  return Number.isFinite(ms) && ms >= 0 ? ms : undefined;
}
