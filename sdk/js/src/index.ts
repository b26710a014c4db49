/** fedldp device SDK for Node: see README.md and docs/sdk.md ("TypeScript SDK"). */
export { FedldpClient, BudgetExhaustedError, NoPolicyError } from "./client.js";
export type { ClientOptions, FlushResult } from "./client.js";
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
