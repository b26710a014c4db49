/**
 * Multi-attribute randomizers (client/mechanisms/multi.py): Wang et al., ICDE 2019,
 * Section IV; Arcolezi et al., CIKM 2021, Section 3 (SPL and SMP).
 *
 * multi-split: every report holds one part per attribute, attribute j's mechanism run at
 * ε/d rounded toward zero to 20 significant digits (so d·ε_j <= ε exactly); the parts use
 * independent randomness. multi-sample: one attribute drawn uniformly (below(d)) and
 * reported at the full ε. Either way a report is charged ε once; memoized attribute
 * mechanisms are refused (their charge would differ from their ε).
 */
import { type Rational, ONE, ZERO, compare, div, equal, int, mul, ratioText, roundSignificant } from "../exact.js";
import { type RandomSource, belowNumber, systemRandom } from "../random.js";
import { type Input, type Mechanism, type Output, ValueError } from "./types.js";

export const MIN_ATTRIBUTES = 2;
export const MAX_ATTRIBUTES = 16;
const SPLIT_DIGITS = 20;

/** One attribute: its name, domain (labels or a numeric range) and mechanism. */
export interface Attribute {
  name: string;
  labels?: readonly string[];
  mechanism: Mechanism;
}

/** ε/d rounded toward zero to 20 significant digits (multi.split_epsilon). */
export function splitEpsilon(epsilon: Rational, d: number): Rational {
  const share = roundSignificant(div(epsilon, int(d)), SPLIT_DIGITS, "floor");
  if (share.num <= 0n || compare(mul(share, int(d)), epsilon) > 0) throw new ValueError("epsilon cannot be split over the attributes");
  return share;
}

/** The ε each attribute mechanism runs at: ε/d (split) or ε (sample). */
export function attributeEpsilon(id: string, epsilon: Rational, d: number): Rational {
  return id === "multi-split" ? splitEpsilon(epsilon, d) : epsilon;
}

export abstract class MultiAttribute implements Mechanism {
  abstract readonly id: string;
  readonly input = "multi" as const;
  readonly memoized = false;
  readonly charge: Rational;
  constructor(readonly epsilon: Rational, readonly attributeEps: Rational, readonly attributes: readonly Attribute[]) {
    if (attributes.length < MIN_ATTRIBUTES || attributes.length > MAX_ATTRIBUTES) {
      throw new ValueError(`a multi-attribute metric needs ${MIN_ATTRIBUTES}..${MAX_ATTRIBUTES} attributes`);
    }
    for (const a of attributes) {
      if (a.mechanism.memoized || !equal(a.mechanism.charge, a.mechanism.epsilon) || a.mechanism.input === "multi") {
        throw new ValueError(`attribute ${a.name}: mechanism ${a.mechanism.id} cannot be an attribute mechanism`);
      }
    }
    this.charge = epsilon;
  }
  get d(): number {
    return this.attributes.length;
  }
  protected values(value: Input): readonly number[] {
    if (typeof value === "number" || typeof value === "string" || value.length !== this.d) throw new ValueError(`takes exactly ${this.d} attribute values`);
    return value;
  }
  thresholds(): Record<string, unknown> {
    return { d: this.d, attribute_epsilon: ratioText(this.attributeEps) };
  }
  abstract perturb(value: Input, rng?: RandomSource): Output;
  protected abstract choice(): Rational;
  probability(value: Input, output: Output): Rational {
    const values = this.values(value);
    if (output.kind !== "multi") return ZERO;
    let total = this.choice();
    for (const { attribute, output: part } of output.parts) {
      const mechanism = this.attributes[attribute]?.mechanism;
      if (mechanism === undefined) return ZERO;
      total = mul(total, mechanism.probability(values[attribute] as number, part));
    }
    return total;
  }
}

export class MultiSplit extends MultiAttribute {
  readonly id = "multi-split";
  perturb(value: Input, rng: RandomSource = systemRandom): Output {
    const values = this.values(value);
    return { kind: "multi", parts: this.attributes.map((a, j) => ({ attribute: j, output: a.mechanism.perturb(values[j] as number, rng) })) };
  }
  protected choice(): Rational {
    return ONE;
  }
  override probability(value: Input, output: Output): Rational {
    if (output.kind !== "multi" || output.parts.length !== this.d || output.parts.some((p, j) => p.attribute !== j)) return ZERO;
    return super.probability(value, output);
  }
}

export class MultiSample extends MultiAttribute {
  readonly id = "multi-sample";
  perturb(value: Input, rng: RandomSource = systemRandom): Output {
    const values = this.values(value);
    const j = belowNumber(this.d, rng);
    return { kind: "multi", parts: [{ attribute: j, output: (this.attributes[j] as Attribute).mechanism.perturb(values[j] as number, rng) }] };
  }
  protected choice(): Rational {
    return { num: 1n, den: BigInt(this.d) };
  }
  override probability(value: Input, output: Output): Rational {
    if (output.kind !== "multi" || output.parts.length !== 1) return ZERO;
    return super.probability(value, output);
  }
}
