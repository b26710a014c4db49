/** gRPC over HTTP/2 (Node only): @grpc/grpc-js against the collector's gRPC port. */
import * as grpc from "@grpc/grpc-js";
import { type CollectorMethod, type CollectorTransport, TransportError, retryHint } from "./transport.js";

export interface GrpcTransportOptions {
  /** host:port of the collector's gRPC endpoint. */
  address: string;
  /** Bearer token (sent as `authorization: Bearer <token>`). */
  token: string;
  /** Plaintext (loopback tests, a TLS-terminating sidecar); TLS otherwise. */
  insecure?: boolean;
  /** Per-call deadline in milliseconds (default 10 000). */
  timeoutMs?: number;
}

export class GrpcTransport implements CollectorTransport {
  private readonly client: grpc.Client;
  private readonly metadata = new grpc.Metadata();

  constructor(private readonly options: GrpcTransportOptions) {
    const credentials = options.insecure ? grpc.credentials.createInsecure() : grpc.credentials.createSsl();
    this.client = new grpc.Client(options.address, credentials);
    this.metadata.set("authorization", `Bearer ${options.token}`);
  }

  call(method: CollectorMethod, request: Uint8Array): Promise<Uint8Array> {
    return new Promise((resolve, reject) => {
      this.client.makeUnaryRequest(
        `/fedldp.v1.Collector/${method}`, (x: Uint8Array) => Buffer.from(x), (b: Buffer) => new Uint8Array(b),
        request, this.metadata, { deadline: Date.now() + (this.options.timeoutMs ?? 10_000) },
        (error, response) => {
          if (error || response === undefined) {
            const e = error as grpc.ServiceError;
            const hint = e?.metadata?.get("retry-after-ms")?.[0];
            reject(new TransportError(e?.details ?? String(e), grpc.status[e?.code ?? grpc.status.UNKNOWN] ?? "UNKNOWN",
              retryHint(hint === undefined ? undefined : hint.toString())));
          } else {
            resolve(response);
          }
        });
    });
  }

  close(): void {
    this.client.close();
  }
}
