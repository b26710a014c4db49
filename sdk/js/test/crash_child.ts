// A device process that outbox.test.ts kills (SIGKILL) while it records: GRR reports
// (charge 1, cap 4 per day) into the state file argv[2], four a day on consecutive days
// (the clock moved one day per four reports), each report id printed once record()
// returned. Never closes the client: what is in the file is what record() made durable.
import { FileStore } from "../src/outbox_file.js";
import { NOW, offlineClient, METRIC } from "./outbox_kit.js";

let index = 0;
const { client } = await offlineClient(new FileStore(process.argv[2]!), "valid", () => NOW + BigInt(Math.floor(index / 4)) * 86_400n);
for (; index < 100; index += 1) {
  await client.record(METRIC, ["chrome", "firefox", "safari", "other"][index % 4]!);
  const pending = client.pendingReports();
  process.stdout.write(`${pending[pending.length - 1]!.id}\n`);
}
setInterval(() => undefined, 60_000); // wait to be killed
