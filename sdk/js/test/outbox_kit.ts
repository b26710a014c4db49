// Shared by outbox.test.ts and crash_child.ts: a client with no network — GetPolicies
// answers one policy of conformance/v1/policies.json (its trust pinned), Submit answers
// ACCEPTED for every report — over a real state file (FileStore).
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { FedldpClient } from "../src/client.js";
import {
  GetPoliciesResponseSchema, Outcome, SubmitRequestSchema, SubmitResponseSchema,
} from "../src/gen/fedldp/v1/collector_pb.js";
import { SignedEnvelopeSchema } from "../src/gen/fedldp/v1/policy_pb.js";
import { type StateStore } from "../src/outbox.js";
import { type CollectorMethod, type CollectorTransport } from "../src/transport.js";
import { fromHex, load } from "./vectors.js";

/** The conformance case names: "valid" (GRR, k = 4, charge 1, cap 4) or "memoized, valid" (RAPPOR-GRR). */
export type CaseName = "valid" | "memoized, valid";
export const METRIC = "browser.name";

/** GetPolicies: the one case's envelope; Submit: ACCEPTED for each report (ids kept in `accepted`). */
export class OfflineCollector implements CollectorTransport {
  readonly accepted: string[] = [];
  constructor(readonly envelope: string) {}
  async call(method: CollectorMethod, request: Uint8Array): Promise<Uint8Array> {
    if (method === "GetPolicies") {
      return toBinary(GetPoliciesResponseSchema, create(GetPoliciesResponseSchema, {
        policies: [fromBinary(SignedEnvelopeSchema, fromHex(this.envelope))],
      }));
    }
    const reports = fromBinary(SubmitRequestSchema, request).reports;
    const ids = reports.map((r) => r.reportId);
    for (const id of ids) this.accepted.push(Buffer.from(id).toString("hex"));
    return toBinary(SubmitResponseSchema, create(SubmitResponseSchema, {
      outcomes: ids.map((reportId) => ({ reportId, outcome: Outcome.ACCEPTED })),
    }));
  }
  close(): void {}
}

/** The case's `now` (Unix seconds): its policies are valid from 2 h before to about 30 days after. */
export const NOW = 1_700_000_000n;

/** A client of case `name` over `store`; the clock is `clock()` (the case's `now` by default). */
export async function offlineClient(
  store: StateStore, name: CaseName = "valid", clock: () => bigint = () => NOW,
): Promise<{ client: FedldpClient; collector: OfflineCollector }> {
  const data = load("policies.json");
  const c = data.cases.find((x: { name: string }) => x.name === name);
  const collector = new OfflineCollector(c.envelope);
  const client = await FedldpClient.open({
    store, transport: collector, pinnedRootKeys: data.trust.pinned_root_keys.map(fromHex),
    rootEnvelope: fromHex(data.trust.root_envelope), now: clock,
  });
  return { client, collector };
}
