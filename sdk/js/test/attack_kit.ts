// Shared by the attack_*.test.ts files: an in-memory StateStore (the client's state as
// saved, cloned so a test reads exactly what was stored).
import { type State, type StateStore } from "../src/outbox.js";

export class MemoryStore implements StateStore {
  constructor(public state: State | undefined = undefined) {}
  async load(): Promise<State | undefined> { return this.state === undefined ? undefined : structuredClone(this.state); }
  async save(state: State): Promise<void> { this.state = structuredClone(state); }
  close(): void {}
}
