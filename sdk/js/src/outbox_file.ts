/** The device state in a file (Node): write a temporary file, fsync, rename, fsync the folder. */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { type State, type StateStore, checkState } from "./outbox.js";

export class FileStore implements StateStore {
  constructor(readonly file: string) {}

  async load(): Promise<State | undefined> {
    try {
      return checkState(JSON.parse(await fs.readFile(this.file, "utf8")));
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
      throw error;
    }
  }

  async save(state: State): Promise<void> {
    const temporary = `${this.file}.tmp`;
    const handle = await fs.open(temporary, "w", 0o600);
    try {
      await handle.writeFile(JSON.stringify(state));
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
  }

  close(): void {}
}
