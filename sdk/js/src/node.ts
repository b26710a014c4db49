/**
 * Node: a client over gRPC (@grpc/grpc-js, the collector's gRPC port) or over the
 * collector's web endpoint (Connect / gRPC-Web with fetch), its outbox in a file.
 */
import { type CoreOptions, FedldpClient } from "./client.js";
import { FileStore } from "./outbox_file.js";
import type { CollectorTransport } from "./transport.js";
import { ConnectTransport } from "./transport_connect.js";
import { GrpcTransport } from "./transport_grpc.js";

export interface ClientOptions extends CoreOptions {
  /** host:port of the collector's gRPC endpoint (or set `webUrl`). */
  collector?: string;
  /** Base URL of the collector's web endpoint (Connect / gRPC-Web) instead of gRPC. */
  webUrl?: string;
  /** With `webUrl`: "connect" (default) or "grpc-web". */
  protocol?: "connect" | "grpc-web";
  /** Bearer token (sent as `authorization: Bearer <token>`). */
  token: string;
  /** The device state file (outbox, spend, versions); created if missing. */
  stateFile: string;
  /** Plaintext gRPC (loopback tests, a TLS-terminating sidecar); TLS otherwise. */
  insecure?: boolean;
}

/** The transport `options` ask for. */
export function nodeTransport(options: ClientOptions): CollectorTransport {
  if (options.webUrl !== undefined) {
    return new ConnectTransport({ baseUrl: options.webUrl, token: options.token, protocol: options.protocol ?? "connect" });
  }
  if (options.collector === undefined) throw new Error("set collector (gRPC host:port) or webUrl");
  return new GrpcTransport({ address: options.collector, token: options.token, insecure: options.insecure ?? false });
}

/** Open (or create) the state file, trust the pinned root and fetch the policies. */
export function openClient(options: ClientOptions): Promise<FedldpClient> {
  return FedldpClient.open({ ...options, store: new FileStore(options.stateFile), transport: nodeTransport(options) });
}
