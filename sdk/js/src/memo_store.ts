/**
 * How the device state keeps memoized permanent responses without naming the values
 * recorded (the Python SDK's memo table, device_store.py `memo_key`): each slot a
 * mechanism draws (a value index; a negative slot such as loloha's seed) is stored
 * under HMAC-SHA256(secret, utf8(metric) || 0x00 || slot as 4-byte big-endian two's
 * complement), hex, grouped by metric and memo key (the mechanism and all its
 * parameters). `secret` is 32 random bytes made once per device state (kept in the
 * state, like the Python meta row `memo_secret`) and never changed, so a copy of the
 * state does not list which labels were recorded and candidate values cannot be
 * hashed and matched without it.
 */
import { sha256Sync } from "./sha256.js";
import { randomBytes } from "./random.js";
import { MemoState } from "./mechanisms.js";
import { fromHex, hex } from "./policy.js";

/** metric -> memo key (mechanism parameters) -> keyed slot digest (hex) -> response (hex). */
export type MemoRows = Record<string, Record<string, Record<string, string>>>;

/** HMAC-SHA256 (RFC 2104) of `message` under `key`. */
export function hmacSha256(key: Uint8Array, message: Uint8Array): Uint8Array {
  const block = new Uint8Array(64);
  block.set(key.length > 64 ? sha256Sync(key) : key);
  const inner = new Uint8Array(64 + message.length);
  const outer = new Uint8Array(64 + 32);
  for (let i = 0; i < 64; i += 1) {
    inner[i] = block[i]! ^ 0x36;
    outer[i] = block[i]! ^ 0x5c;
  }
  inner.set(message, 64);
  outer.set(sha256Sync(inner), 64);
  return sha256Sync(outer);
}

/** A fresh per-device memo secret (hex of 32 bytes from the platform CSPRNG). */
export function newMemoSecret(): string {
  return hex(randomBytes(32));
}

/** The stored key of memo slot `slot` of `metric` (device_store.py memo_key of the slot's 4 bytes). */
export function memoSlotKey(secret: string, metric: string, slot: number): string {
  const name = new TextEncoder().encode(metric);
  const message = new Uint8Array(name.length + 5);
  message.set(name);
  new DataView(message.buffer).setInt32(name.length + 1, slot);
  return hex(hmacSha256(fromHex(secret), message));
}

/** The slots of `memo` that `rows` holds for (metric, memo.key), loaded into `memo`. */
export function loadSlots(rows: MemoRows, secret: string, metric: string, memo: MemoState, slots: number[]): void {
  const scope = rows[metric]?.[memo.key];
  if (scope === undefined) return;
  for (const slot of slots) {
    const stored = scope[memoSlotKey(secret, metric, slot)];
    if (stored !== undefined) memo.responses.set(slot, fromHex(stored));
  }
}

/**
 * Save `slots` of `memo` into `rows` under (metric, memo.key); the rows written, as
 * [metric, memo key, keyed slot digest, response hex] (a Change's `memo`).
 */
export function saveSlots(
  rows: MemoRows, secret: string, metric: string, memo: MemoState, slots: Iterable<number>,
): [string, string, string, string][] {
  const scope = ((rows[metric] ??= {})[memo.key] ??= {});
  const written: [string, string, string, string][] = [];
  for (const slot of slots) {
    const key = memoSlotKey(secret, metric, slot);
    scope[key] = hex(memo.responses.get(slot)!);
    written.push([metric, memo.key, key, scope[key]]);
  }
  return written;
}

/** Rows for the earlier layout (MemoState JSON by metric, keyed by value index), re-keyed. */
export function migrateMemos(legacy: Record<string, string>, rows: MemoRows, secret: string): void {
  for (const [metric, text] of Object.entries(legacy)) {
    const memo = MemoState.fromJSON(text);
    saveSlots(rows, secret, metric, memo, memo.responses.keys());
  }
}
