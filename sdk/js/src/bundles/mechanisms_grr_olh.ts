/**
 * What policy.ts imports from ../mechanisms.js, for the GRR/OLH browser bundle
 * (scripts/build_browser.mjs resolves policy.ts's "./mechanisms.js" here): the same
 * exports, but a `createMechanism` that builds GRR and OLH only, so the bundle does
 * not carry the other mechanisms; a policy naming another one is refused ("not
 * supported by this SDK"), as the full SDK refuses one it does not know.
 */
import type { Rational } from "../exact.js";
import { GRR, OLH, type Mechanism, type MetricDomain, ValueError } from "../mechanisms.js";

export { MAX_OPEN_DOMAIN_BYTES } from "../mechanisms.js";
export type { AttributeDomain, Mechanism, MetricDomain } from "../mechanisms.js";

/** GRR or OLH from a policy's id, ε, domain and params (createMechanism's contract). */
export function createMechanism(id: string, epsilon: Rational, domain: MetricDomain, params: Record<string, string> = {}): Mechanism {
  const allowed: Record<string, string[]> = { grr: [], olh: ["g"] };
  const names = allowed[id];
  if (names === undefined) throw new ValueError(`mechanism ${id} is not supported by this SDK`);
  for (const name of Object.keys(params)) {
    if (!names.includes(name)) throw new ValueError(`${id} does not take parameter ${name}`);
  }
  if (typeof domain !== "number") throw new ValueError(`${id} needs a categorical metric (a domain size k)`);
  if (id === "grr") return new GRR(epsilon, domain);
  const g = params.g;
  if (g !== undefined && !/^[0-9]{1,19}$/.test(g)) throw new ValueError("parameter g must be a plain integer");
  return new OLH(epsilon, domain, g === undefined ? undefined : Number(g));
}
