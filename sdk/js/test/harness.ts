// A real `fedldp collector serve` (the repository's .venv) for the Node and browser tests:
// a throwaway deployment (collector_fixture.py), the collector started on port 0 with its
// gRPC and web ports read from the port files, stopped with SIGTERM (it drains).
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";

export const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../../..");
export const python = path.join(repo, ".venv/bin/python");
export const fedldp = path.join(repo, ".venv/bin/fedldp");
/** Why the collector tests cannot run here, or false. */
export const noCollector: string | false = existsSync(fedldp) ? false : "no .venv/bin/fedldp: run make .venv/.test-installed";

export interface Fixture {
  config: string;
  token: string;
  web_token: string;
  other_token: string;
  web_labels: string[];
  pinned_root_keys: string[];
  root_envelope: string;
  metrics: Record<string, string>;
}

/** A deployment folder with its fixture (web endpoint on when `origins` are given). */
export function makeDeployment(origins: string[] = []): { dir: string; fixture: Fixture } {
  const dir = mkdtempSync(path.join(tmpdir(), "fedldp-js-"));
  const setup = spawnSync(python, [path.join(repo, "sdk/js/test/collector_fixture.py"), dir, ...origins], { encoding: "utf8" });
  if (setup.status !== 0) throw new Error(`collector_fixture.py failed: ${setup.stderr}`);
  return { dir, fixture: JSON.parse(readFileSync(path.join(dir, "fixture.json"), "utf8")) as Fixture };
}

async function waitFor(file: string, proc: ChildProcess, seconds: number): Promise<string> {
  const deadline = Date.now() + seconds * 1000;
  while (!existsSync(file)) {
    if (proc.exitCode !== null) throw new Error(`collector exited with ${proc.exitCode}`);
    if (Date.now() > deadline) throw new Error("collector did not start");
    await new Promise((r) => setTimeout(r, 100));
  }
  return readFileSync(file, "utf8").trim();
}

export interface Collector { grpcPort: string; webPort: string | undefined; stop(): Promise<void> }

/** Start `fedldp collector serve` on the deployment (`env`: extra FEDLDP_COLLECTOR_* settings). */
export async function startCollector(dir: string, fixture: Fixture, env: Record<string, string> = {}): Promise<Collector> {
  const portFile = path.join(dir, `port-${Date.now()}`);
  const proc = spawn(fedldp, ["collector", "serve", "--config", fixture.config, "--port-file", portFile],
    { stdio: ["ignore", "ignore", "inherit"], env: { ...process.env, ...env } });
  try {
    const grpcPort = await waitFor(portFile, proc, 60);
    const webPort = existsSync(`${portFile}.web`) ? readFileSync(`${portFile}.web`, "utf8").trim() : undefined;
    return {
      grpcPort, webPort,
      async stop() {
        if (proc.exitCode === null) {
          proc.kill("SIGTERM");
          await new Promise((r) => proc.once("exit", r));
        }
      },
    };
  } catch (error) {
    proc.kill("SIGKILL");
    throw error;
  }
}

/** The ledger's windows of `subject`, by policy id (`fedldp ledger show --json`). */
export function ledgerWindows(fixture: Fixture, subject: string): Record<string, { reports: number; epsilon_spent: string }> {
  const show = spawnSync(fedldp, ["ledger", "show", subject, "--config", fixture.config, "--json"], { encoding: "utf8" });
  if (show.status !== 0) throw new Error(`fedldp ledger show failed: ${show.stderr}`);
  const windows = JSON.parse(show.stdout).windows as { policy_id: string; reports: number; epsilon_spent: string }[];
  return Object.fromEntries(windows.map((w) => [w.policy_id, w]));
}

export function removeDeployment(dir: string): void {
  rmSync(dir, { recursive: true, force: true });
}
