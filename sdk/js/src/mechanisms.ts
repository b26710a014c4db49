/**
 * The randomizers this SDK runs, by the wire id a signed policy names
 * (client/mechanisms/registry.py): categorical (mechanisms/categorical.ts),
 * memoized (mechanisms/memo.ts) and numeric on finite grids (mechanisms/numeric.ts).
 * Every probability a sampler realizes is an exact rational; `probability` states
 * it and the conformance test compares it with conformance/v1/mechanisms.json.
 */
import { type Rational, parseDecimal } from "./exact.js";
import { GRR, HadamardResponse, OLH, OUE, SUE, SubsetSelection } from "./mechanisms/categorical.js";
import { DBitFlip } from "./mechanisms/dbitflip.js";
import { Loloha } from "./mechanisms/loloha.js";
import { RapporGRR, RapporOUE, RapporSUE } from "./mechanisms/memo.js";
import { Duchi, Hybrid, type NumericRange, Piecewise, SquareWave } from "./mechanisms/numeric.js";
import { type Attribute, MultiSample, MultiSplit, attributeEpsilon } from "./mechanisms/multi.js";
import { PEM } from "./mechanisms/pem.js";
import { CMS, HCMS, MAX_OPEN_DOMAIN_BYTES, type OpenDomain, encodeOpen } from "./mechanisms/sketch.js";
import { type Input, type Mechanism, ValueError } from "./mechanisms/types.js";

export * from "./mechanisms/categorical.js";
export * from "./mechanisms/dbitflip.js";
export * from "./mechanisms/loloha.js";
export * from "./mechanisms/memo.js";
export * from "./mechanisms/multi.js";
export * from "./mechanisms/numeric.js";
export * from "./mechanisms/pem.js";
export * from "./mechanisms/sketch.js";
export * from "./mechanisms/types.js";

/** The mechanism ids this SDK randomizes. */
export const SUPPORTED = [
  "grr", "oue", "sue", "olh", "hr", "ss", "rappor-grr", "rappor-oue", "rappor-sue",
  "loloha", "dbitflip", "duchi", "piecewise", "hybrid", "sw", "multi-split", "multi-sample",
  "cms", "hcms", "pem",
] as const;

/** Registered by the Python SDK but not randomized here yet (a policy naming one is refused). */
export const NOT_YET = [] as const;

/** One attribute of a multi-attribute metric: its domain and its own mechanism id and params. */
export interface AttributeDomain {
  name: string;
  /** Categorical labels (k = labels.length), or a numeric range. */
  labels?: readonly string[];
  range?: NumericRange;
  mechanism: string;
  params?: Record<string, string>;
}

/** A metric's domain: a categorical domain size k, a numeric range, or attributes. */
export type MetricDomain = number | NumericRange | OpenDomain | { attributes: readonly AttributeDomain[] };

function intParam(params: Record<string, string>, name: string): number | undefined {
  const text = params[name];
  if (text === undefined) return undefined;
  if (!/^[0-9]{1,19}$/.test(text)) throw new ValueError(`parameter ${name} must be a plain integer`);
  return Number(text);
}

const ALLOWED: Record<string, string[]> = {
  grr: [], oue: [], sue: [], hr: [], olh: ["g"], ss: ["d"],
  "rappor-grr": ["epsilon_permanent"], "rappor-oue": ["epsilon_permanent"], "rappor-sue": ["epsilon_permanent"],
  loloha: ["epsilon_permanent", "g"], dbitflip: ["epsilon_permanent", "buckets", "d"],
  duchi: [], piecewise: ["levels", "cells"], hybrid: ["levels", "cells"], sw: ["levels", "cells"],
  "multi-split": [], "multi-sample": [], cms: ["rows", "columns"], hcms: ["rows", "columns"],
  pem: ["step_bits", "start_bits", "groups", "g"],
};

function open(id: string, domain: MetricDomain): OpenDomain {
  if (typeof domain === "number" || !("maxBytes" in domain)) throw new ValueError(`${id} needs an open-domain metric (max_bytes)`);
  if (!Number.isInteger(domain.maxBytes) || domain.maxBytes < 1 || domain.maxBytes > MAX_OPEN_DOMAIN_BYTES) {
    throw new ValueError(`an open domain's max_bytes must be in [1, ${MAX_OPEN_DOMAIN_BYTES}]`);
  }
  return domain;
}

function categorical(id: string, domain: MetricDomain): number {
  if (typeof domain !== "number") throw new ValueError(`${id} needs a categorical metric (a domain size k)`);
  return domain;
}

function numeric(id: string, domain: MetricDomain): NumericRange {
  if (typeof domain === "number" || !("lo" in domain)) throw new ValueError(`${id} needs a numeric metric (lo, hi)`);
  return domain;
}

/** The attribute mechanisms of a multi-attribute metric, each at the mode's ε (multi.build_attribute). */
function attributesOf(id: string, epsilon: Rational, domain: MetricDomain): Attribute[] {
  if (typeof domain === "number" || !("attributes" in domain)) throw new ValueError(`${id} needs a multi-attribute metric`);
  const share = attributeEpsilon(id, epsilon, domain.attributes.length);
  return domain.attributes.map((a) => {
    if (a.mechanism === "multi-split" || a.mechanism === "multi-sample") {
      throw new ValueError(`attribute ${a.name}: a multi-attribute mechanism cannot be nested`);
    }
    const sub = a.labels !== undefined ? a.labels.length : a.range;
    if (sub === undefined) throw new ValueError(`attribute ${a.name} has no domain`);
    return { name: a.name, ...(a.labels ? { labels: a.labels } : {}), mechanism: createMechanism(a.mechanism, share, sub, a.params ?? {}) };
  });
}

function permanent(id: string, params: Record<string, string>): Rational {
  const text = params.epsilon_permanent;
  if (text === undefined) throw new ValueError(`${id} needs parameter epsilon_permanent (lifetime epsilon)`);
  try {
    const value = parseDecimal(text);
    if (value.num > 0n) return value;
  } catch { /* reported below */ }
  throw new ValueError(`${id} parameter epsilon_permanent must be a positive plain decimal`);
}

/** Build a mechanism from a policy's id, ε, metric domain and params (registry.create). */
export function createMechanism(
  id: string, epsilon: Rational, domain: MetricDomain, params: Record<string, string> = {},
): Mechanism {
  const names = ALLOWED[id];
  if (names === undefined) throw new ValueError(`mechanism ${id} is not supported by this SDK`);
  for (const name of Object.keys(params)) {
    if (!names.includes(name)) throw new ValueError(`${id} does not take parameter ${name}`);
  }
  switch (id) {
    case "grr": return new GRR(epsilon, categorical(id, domain));
    case "oue": return new OUE(epsilon, categorical(id, domain));
    case "sue": return new SUE(epsilon, categorical(id, domain));
    case "hr": return new HadamardResponse(epsilon, categorical(id, domain));
    case "olh": return new OLH(epsilon, categorical(id, domain), intParam(params, "g"));
    case "ss": return new SubsetSelection(epsilon, categorical(id, domain), intParam(params, "d"));
    case "rappor-grr": return new RapporGRR(epsilon, categorical(id, domain), permanent(id, params));
    case "rappor-oue": return new RapporOUE(epsilon, categorical(id, domain), permanent(id, params));
    case "rappor-sue": return new RapporSUE(epsilon, categorical(id, domain), permanent(id, params));
    case "loloha": return new Loloha(epsilon, categorical(id, domain), permanent(id, params), intParam(params, "g"));
    case "dbitflip": {
      const buckets = intParam(params, "buckets");
      if (buckets === undefined) throw new ValueError("dbitflip needs parameter buckets");
      return new DBitFlip(epsilon, numeric(id, domain), buckets, permanent(id, params), intParam(params, "d"));
    }
    case "duchi": return new Duchi(epsilon, numeric(id, domain));
    case "piecewise": return new Piecewise(epsilon, numeric(id, domain), params);
    case "hybrid": return new Hybrid(epsilon, numeric(id, domain), params);
    case "sw": return new SquareWave(epsilon, numeric(id, domain), params);
    case "pem": return new PEM(epsilon, open(id, domain), params);
    case "cms": return new CMS(epsilon, open(id, domain), params);
    case "hcms": return new HCMS(epsilon, open(id, domain), params);
    case "multi-split": {
      const attributes = attributesOf(id, epsilon, domain);
      return new MultiSplit(epsilon, attributeEpsilon(id, epsilon, attributes.length), attributes);
    }
    default: return new MultiSample(epsilon, epsilon, attributesOf(id, epsilon, domain));
  }
}

/**
 * The randomizer input of a recorded value: a categorical label's index in `labels`, a
 * finite number for a numeric metric (clipped by the mechanism), an open-domain string
 * (validated: 1..max_bytes UTF-8 bytes, no NUL, no lone surrogate), or for a multi-attribute
 * metric an array (attribute order) or object (by attribute name) of those. Errors name
 * the expected type and the domain's size, never the value.
 */
export function encodeValue(mechanism: Mechanism, labels: readonly string[], value: unknown): Input {
  if (mechanism.input === "multi") {
    const attributes = (mechanism as MultiSplit | MultiSample).attributes;
    const items = Array.isArray(value) ? value
      : typeof value === "object" && value !== null ? attributes.map((a) => (value as Record<string, unknown>)[a.name])
        : undefined;
    if (items === undefined || items.length !== attributes.length) {
      throw new ValueError(`this metric has ${attributes.length} attributes: pass an array or an object of their values`);
    }
    return attributes.map((a, j) => {
      try {
        return encodeValue(a.mechanism, a.labels ?? [], items[j]) as number;
      } catch (error) {
        throw new ValueError(`attribute ${a.name}: ${(error as Error).message}`);
      }
    });
  }
  if (mechanism.input === "string") {
    encodeOpen((mechanism as CMS | HCMS | PEM).domain, value); // validated here, hashed by the randomizer
    return value as string;
  }
  if (mechanism.input === "index") {
    if (typeof value !== "string") throw new ValueError(`this metric is categorical: pass a label (string), not a ${typeof value}`);
    const index = labels.indexOf(value);
    if (index < 0) throw new ValueError(`value is not in the metric's domain (${labels.length} labels)`);
    return index;
  }
  if (typeof value !== "number") throw new ValueError(`this metric is numeric: pass a number, not a ${typeof value}`);
  if (!Number.isFinite(value)) throw new ValueError("value must be a finite number");
  return value;
}
