/**
 * The mechanism factory of the GRR/OLH browser bundle (scripts/build_browser.mjs
 * puts it in place of ../mechanisms.js's `createMechanism` for policy.ts), so the
 * bundle carries only GRR and OLH; a policy naming another mechanism is refused
 * ("not supported by this SDK"), as the full SDK refuses one it does not know.
 */
import type { Rational } from "../exact.js";
import { GRR, OLH, type Mechanism, ValueError } from "../mechanisms.js";

export { GRR, OLH, ValueError };
export type { Mechanism, Output } from "../mechanisms.js";

/** GRR or OLH from a policy's id, ε, domain size and params (createMechanism's contract). */
export function createMechanism(id: string, epsilon: Rational, k: number, params: Record<string, string> = {}): Mechanism {
  const allowed: Record<string, string[]> = { grr: [], olh: ["g"] };
  const names = allowed[id];
  if (names === undefined) throw new ValueError(`mechanism ${id} is not supported by this SDK`);
  for (const name of Object.keys(params)) {
    if (!names.includes(name)) throw new ValueError(`${id} does not take parameter ${name}`);
  }
  if (id === "grr") return new GRR(epsilon, k);
  const g = params.g;
  if (g !== undefined && !/^[0-9]{1,19}$/.test(g)) throw new ValueError("parameter g must be a plain integer");
  return new OLH(epsilon, k, g === undefined ? undefined : Number(g));
}
