/**
 * The Connect protocol or gRPC-Web over fetch (browsers, and Node >= 20 which has
 * fetch), with @connectrpc/connect-web, against the collector's web endpoint
 * (`web_listen`, docs/collector.md "Web endpoint"). Protobuf bodies only. The gRPC-Web
 * transport is imported on first use only (a separate chunk of the browser bundles), so a
 * page on the Connect protocol does not load it.
 */
import { Code, ConnectError, type Transport } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { fromBinary, toBinary, type DescMessage } from "@bufbuild/protobuf";
import { Collector } from "./gen/fedldp/v1/collector_pb.js";
import { type CollectorMethod, type CollectorTransport, TransportError, retryHint } from "./transport.js";

export interface ConnectTransportOptions {
  /** Base URL of the collector's web endpoint, e.g. https://collector.example.com:8443 */
  baseUrl: string;
  /** Bearer token (sent as `authorization: Bearer <token>`). */
  token: string;
  /** "connect" (default) or "grpc-web". */
  protocol?: "connect" | "grpc-web";
  /** Per-call timeout in milliseconds (default 10 000). */
  timeoutMs?: number;
  /** A fetch to use instead of globalThis.fetch (tests). */
  fetch?: typeof globalThis.fetch;
}

/** gRPC's name of a Connect code (the same names; CANCELED is CANCELLED). */
function grpcName(code: Code): string {
  const name = Code[code] ?? "Unknown";
  const snake = name.replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
  return snake === "CANCELED" ? "CANCELLED" : snake;
}

export class ConnectTransport implements CollectorTransport {
  private transport: Transport | undefined;

  constructor(private readonly options: ConnectTransportOptions) {}

  /** The Connect transport, or the gRPC-Web one (imported on first use). */
  private async open(): Promise<Transport> {
    if (this.transport !== undefined) return this.transport;
    const options = {
      baseUrl: this.options.baseUrl,
      useBinaryFormat: true,
      ...(this.options.fetch ? { fetch: this.options.fetch } : {}),
    };
    const make = this.options.protocol === "grpc-web"
      ? (await import("./transport_grpc_web.js")).createGrpcWebTransport
      : createConnectTransport;
    this.transport = make(options);
    return this.transport;
  }

  async call(method: CollectorMethod, request: Uint8Array): Promise<Uint8Array> {
    const desc = method === "Submit" ? Collector.method.submit : Collector.method.getPolicies;
    const input = desc.input as DescMessage;
    const transport = await this.open();
    try {
      const response = await transport.unary(
        desc as never, undefined, this.options.timeoutMs ?? 10_000,
        { authorization: `Bearer ${this.options.token}` },
        fromBinary(input, request) as never, undefined,
      );
      return toBinary(desc.output as DescMessage, response.message as never);
    } catch (error) {
      const e = ConnectError.from(error);
      throw new TransportError(e.rawMessage, grpcName(e.code), retryHint(e.metadata.get("retry-after-ms")));
    }
  }

  close(): void {}
}
