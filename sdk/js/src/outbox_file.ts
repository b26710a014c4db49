/**
 * The device state in a file (Node), as an append-only log:
 *
 *     "FEDLDPL1"  then frames:  u32 length (big-endian) | u32 CRC-32 of the payload | payload
 *
 * Each payload is UTF-8 JSON. The first frame is a full State; every later frame a Change
 * (outbox.ts) applied over it in order. record() appends one frame and fdatasyncs the file
 * before it returns (the Python SDK commits each report with an fsync: device_store.py,
 * SQLite WAL with synchronous=FULL), so a report that returned survives a crash or power
 * loss, together with its spend and memo rows (one frame: all or nothing).
 *
 * The file is extended with zero bytes 256 KiB at a time (fsync'd), so an append writes
 * into space the file already has and its fdatasync need not change the file's size.
 *
 * Crash recovery: a crash can tear only the frame being appended, so at `load` a last
 * frame that is incomplete or fails its CRC — with nothing but zero bytes after it — is
 * that torn append (its record() never returned): it is dropped and the file truncated
 * there before the next append. A bad frame followed by other bytes is corruption, not a
 * torn tail, and `load` throws rather than drop reports after it.
 *
 * Compaction: `save` (and an `append` once the frames since the last full state outgrow it
 * and 64 KiB) writes the whole state as the one frame of a new file — temporary file,
 * fsync, rename, fsync of the folder — so acknowledged reports leave the file and the
 * cost per record stays constant on average. A file holding plain JSON (the earlier
 * layout, "fedldp.js.state.v1") is read as the full state and rewritten at the next save.
 * One writer per file (one client).
 */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { type Change, type State, type StateStore, applyChange, checkState, withChange } from "./outbox.js";

const MAGIC = Buffer.from("FEDLDPL1", "latin1");
const HEADER = 8;
/** Appended bytes below this never trigger a compaction. */
const COMPACT_MIN_BYTES = 64 * 1024;
/** Zero bytes added past the end at a time, so that an append does not change the file's size. */
const PREALLOCATE_BYTES = 256 * 1024;

const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n += 1) {
    let c = n;
    for (let k = 0; k < 8; k += 1) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();

/** CRC-32 (IEEE 802.3, as zlib's crc32) of `bytes`. */
export function crc32(bytes: Uint8Array): number {
  let c = 0xffffffff;
  for (const b of bytes) c = CRC_TABLE[(c ^ b) & 0xff]! ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

/** One frame: length, CRC-32, the JSON of `value`. */
export function frame(value: unknown): Buffer {
  const payload = Buffer.from(JSON.stringify(value), "utf8");
  const out = Buffer.allocUnsafe(HEADER + payload.length);
  out.writeUInt32BE(payload.length, 0);
  out.writeUInt32BE(crc32(payload), 4);
  payload.copy(out, HEADER);
  return out;
}

/** The log read back: the state, where the valid frames end, and the sizes compaction weighs. */
export interface ParsedLog {
  state: State;
  validEnd: number;
  snapshotBytes: number;
  changeBytes: number;
  /** Whether only zero bytes (preallocated space) follow `validEnd`: false after a torn append. */
  cleanTail: boolean;
}

/**
 * Parse a log file's bytes (the layout above): the first frame's state with every later
 * valid frame applied. A torn last frame (incomplete or failing its CRC, only zero bytes
 * after it) ends the log at `validEnd`; any other bad frame throws.
 */
export function parseLog(bytes: Buffer): ParsedLog {
  if (bytes.length < MAGIC.length || !bytes.subarray(0, MAGIC.length).equals(MAGIC)) {
    throw new Error("unknown device state format");
  }
  let offset = MAGIC.length;
  let state: State | undefined;
  let snapshotBytes = 0;
  while (offset < bytes.length) {
    const payload = framePayload(bytes, offset);
    if (payload === undefined) {
      if (state !== undefined && bytes.subarray(offset).every((b) => b === 0) || tornTail(bytes, offset)) break;
      throw new Error(`device state file is corrupt at byte ${offset} (a bad frame before the end)`);
    }
    const value: unknown = JSON.parse(payload.toString("utf8"));
    if (state === undefined) {
      state = checkState(value);
      snapshotBytes = HEADER + payload.length;
    } else {
      applyChange(state, value as Change);
    }
    offset += HEADER + payload.length;
  }
  if (state === undefined) throw new Error("device state file holds no state (its first frame is torn)");
  const cleanTail = bytes.subarray(offset).every((b) => b === 0);
  return { state, validEnd: offset, snapshotBytes, changeBytes: offset - MAGIC.length - snapshotBytes, cleanTail };
}

/** The payload of the frame at `offset`, or undefined if it is incomplete or fails its CRC. */
function framePayload(bytes: Buffer, offset: number): Buffer | undefined {
  if (offset + HEADER > bytes.length) return undefined;
  const length = bytes.readUInt32BE(offset);
  const end = offset + HEADER + length;
  if (length === 0 || end > bytes.length) return undefined;
  const payload = bytes.subarray(offset + HEADER, end);
  return crc32(payload) === bytes.readUInt32BE(offset + 4) ? payload : undefined;
}

/** Whether the bad frame at `offset` is a torn append: it claims to reach the end of the file, or past it. */
function tornTail(bytes: Buffer, offset: number): boolean {
  if (offset + HEADER > bytes.length) return true;
  const end = offset + HEADER + bytes.readUInt32BE(offset);
  return end >= bytes.length || bytes.subarray(end).every((b) => b === 0);
}

export class FileStore implements StateStore {
  private handle: fs.FileHandle | undefined;
  /** Where the next frame goes (the end of the valid frames), once loaded or saved. */
  private end = -1;
  private snapshotBytes = 0;
  private changeBytes = 0;
  /** The file's size (valid frames, then zero bytes), and whether a torn frame must be cut first. */
  private size = 0;
  private torn = false;

  constructor(readonly file: string) {}

  async load(): Promise<State | undefined> {
    let bytes: Buffer;
    try {
      bytes = await fs.readFile(this.file);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
      throw error;
    }
    if (bytes.length > 0 && bytes[0] === 0x7b) return checkState(JSON.parse(bytes.toString("utf8"))); // "{": v1 JSON
    const log = parseLog(bytes);
    this.end = log.validEnd;
    this.snapshotBytes = log.snapshotBytes;
    this.changeBytes = log.changeBytes;
    this.size = bytes.length;
    this.torn = !log.cleanTail;
    return log.state;
  }

  /** Compact: the whole state as the one frame of a new file (temporary file, fsync, rename, fsync the folder). */
  async save(state: State): Promise<void> {
    await this.closeHandle();
    const body = frame(state);
    const temporary = `${this.file}.tmp`;
    const handle = await fs.open(temporary, "w", 0o600);
    try {
      await handle.writev([MAGIC, body]);
      await handle.sync();
    } finally {
      await handle.close();
    }
    await fs.rename(temporary, this.file);
    const folder = await fs.open(path.dirname(this.file), "r");
    try {
      await folder.sync();
    } finally {
      await folder.close();
    }
    this.end = MAGIC.length + body.length;
    this.size = this.end;
    this.torn = false;
    this.snapshotBytes = body.length;
    this.changeBytes = 0;
  }

  /**
   * One frame written after the last and fdatasync'd, into preallocated zero bytes so the
   * file's size does not change (extended 256 KiB at a time, with an fsync); a torn frame
   * left by a crash is cut first. Or a compaction (`save`) once the frames outgrew the state.
   */
  async append(state: State, change: Change): Promise<void> {
    if (this.end < 0 || this.changeBytes > Math.max(COMPACT_MIN_BYTES, this.snapshotBytes)) return this.save(withChange(state, change));
    const body = frame(change);
    this.handle ??= await fs.open(this.file, "r+");
    const handle = this.handle;
    try {
      if (this.torn) {
        await handle.truncate(this.end);
        this.size = this.end;
        this.torn = false;
      }
      if (this.end + body.length > this.size) {
        const grown = this.end + body.length + PREALLOCATE_BYTES;
        await handle.write(Buffer.alloc(grown - this.size), 0, grown - this.size, this.size);
        await handle.sync();
        this.size = grown;
      }
      await handle.write(body, 0, body.length, this.end);
      await handle.datasync();
    } catch (error) {
      this.torn = true; // a partial frame may be there: cut it before the next one
      throw error;
    }
    this.end += body.length;
    this.changeBytes += body.length;
  }

  private async closeHandle(): Promise<void> {
    const handle = this.handle;
    this.handle = undefined;
    if (handle !== undefined) await handle.close();
  }

  close(): void {
    void this.closeHandle();
  }
}
