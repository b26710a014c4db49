/** The shapes every randomizer shares: outputs (collector.proto payloads), the Mechanism contract. */
import type { Rational } from "../exact.js";
import type { RandomSource } from "../random.js";

/** A mechanism output: exactly the payload kinds of collector.proto this SDK emits. */
export type Output =
  | { kind: "category"; index: number }
  | { kind: "bits"; bits: Uint8Array; length: number }
  | { kind: "hashed"; seed: bigint; value: number }
  | { kind: "numeric"; value: number }
  | { kind: "index_bits"; indices: number[]; bits: Uint8Array }
  | { kind: "sketch_row"; row: number; bits: Uint8Array; length: number }
  | { kind: "sketch_bit"; row: number; column: number; bit: boolean }
  | { kind: "group_hashed"; group: number; key: Uint8Array; value: number }
  | { kind: "multi"; parts: Array<{ attribute: number; output: Output }> };

/** What a randomizer takes: a categorical index, a real number, or one of those per attribute. */
export type Input = number | string | readonly number[];

/** Error for a value or parameter outside the domain; the message never carries the value. */
export class ValueError extends Error {}

/**
 * Permanent responses of one (user, metric) of a memoized mechanism (memo.py's MemoState):
 * value index -> response bytes (4-byte little-endian index for rappor-grr, packed k bits
 * for rappor-oue / rappor-sue). `key` binds it to the mechanism and all its parameters.
 * The client persists it atomically with the report it produced.
 */
export class MemoState {
  constructor(readonly key: string, readonly responses: Map<number, Uint8Array> = new Map()) {}

  /** memo.py's to_json layout: {"key":..,"responses":{"<index>":"<hex>"}}, keys sorted, compact. */
  toJSON(): string {
    const entries = [...this.responses.entries()].map(([v, b]) => [String(v), hexOf(b)] as const);
    entries.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
    const responses = entries.map(([v, h]) => `${JSON.stringify(v)}:${JSON.stringify(h)}`).join(",");
    return `{"key":${JSON.stringify(this.key)},"responses":{${responses}}}`;
  }

  /** Parse `toJSON` output; a ValueError (without the content) on anything else. */
  static fromJSON(text: string): MemoState {
    try {
      const data = JSON.parse(text) as { key: unknown; responses: unknown };
      if (typeof data.key !== "string" || typeof data.responses !== "object" || data.responses === null) {
        throw new Error("layout");
      }
      const responses = new Map<number, Uint8Array>();
      for (const [v, h] of Object.entries(data.responses as Record<string, unknown>)) {
        if (!/^(-1|0|[1-9][0-9]{0,9})$/.test(v) || typeof h !== "string" || !/^([0-9a-f]{2})*$/.test(h)) {
          throw new Error("entry");
        }
        responses.set(Number(v), Uint8Array.from(h.match(/../g) ?? [], (x) => parseInt(x, 16)));
      }
      return new MemoState(data.key, responses);
    } catch {
      throw new ValueError("not a serialized MemoState");
    }
  }
}

function hexOf(bytes: Uint8Array): string {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** One built mechanism (immutable; memo state, when any, is passed in). */
export interface Mechanism {
  readonly id: string;
  readonly epsilon: Rational;
  /** What the ledger and the device guard charge per report: ε, or max(ε1, ε_I) memoized. */
  readonly charge: Rational;
  /**
   * "index": a categorical index in [0, k); "number": a real value (clipped to the range);
   * "string": an open-domain string; "multi": one of index or number per attribute.
   */
  readonly input: "index" | "number" | "string" | "multi";
  /** Whether perturb needs a MemoState (newMemo) persisted with the report. */
  readonly memoized: boolean;
  /** The exact integers and rationals the sampler uses, named as in the conformance vectors. */
  thresholds(): Record<string, unknown>;
  /** One randomized report of `value` (memoized mechanisms read and fill `memo`). */
  perturb(value: Input, rng?: RandomSource, memo?: MemoState): Output;
  /** P[output | value] exactly (memoized: the first report, from an empty memo). */
  probability(value: Input, output: Output): Rational;
  /** An empty memo bound to this mechanism's parameters (memoized mechanisms only). */
  newMemo?(): MemoState;
  /** The memo slots perturb(value) reads or writes, given the slots loaded so far (memoized mechanisms only). */
  memoSlots?(value: Input, memo?: MemoState): number[];
}
