/** fedldp device SDK, the Node entry (browser.ts is the browser's): see README.md and docs/sdk.md ("TypeScript SDK"). */
export { FedldpClient, BudgetExhaustedError, NoPolicyError } from "./client.js";
export type { ClientParts, CoreOptions, FlushResult } from "./client.js";
export { openClient, nodeTransport } from "./node.js";
export type { ClientOptions } from "./node.js";
export { FileStore } from "./outbox_file.js";
export type { State, StateStore } from "./outbox.js";
export { type CollectorTransport, TransportError } from "./transport.js";
export { ConnectTransport } from "./transport_connect.js";
export { GrpcTransport } from "./transport_grpc.js";
export { PolicyError, TrustStore, verifyPolicy, pae, keyIdOf, verifyEd25519 } from "./policy.js";
export type { VerifiedPolicy, VerifyOptions } from "./policy.js";
export {
  createMechanism, encodeValue, MemoState, ValueError, SUPPORTED, olhHash, sketchHash, pemHash,
  GRR, OUE, SUE, OLH, HadamardResponse, SubsetSelection, RapporGRR, RapporOUE, RapporSUE, Loloha, DBitFlip,
  Duchi, Piecewise, Hybrid, SquareWave, MultiSplit, MultiSample, CMS, HCMS, PEM,
} from "./mechanisms.js";
export type { Input, Mechanism, MetricDomain, Output } from "./mechanisms.js";
export { ReportIds, reportBytes, submitRequestBytes } from "./wire.js";
export * as exact from "./exact.js";
