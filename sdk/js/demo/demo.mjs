// The `fedldp demo --web` page: records a choice through the SDK's GRR/OLH browser bundle
// into the demo collector's web endpoint (Connect protocol), its outbox in IndexedDB.
// config.json (written by the demo) holds the collector's URL, a bearer token, the pinned
// root key and root envelope, and the metric.
import { openBrowserClient, fromHex } from "./fedldp.grr-olh.min.js";

const config = await (await fetch("./config.json")).json();
const log = document.getElementById("log");
const say = (text) => { log.textContent += `${text}\n`; };

const client = await openBrowserClient({
  collectorUrl: config.collectorUrl, token: config.token, protocol: "connect",
  pinnedRootKeys: config.pinnedRootKeys.map(fromHex), rootEnvelope: fromHex(config.rootEnvelope),
  database: "fedldp-demo",
});
const policy = client.policy(config.metric);
document.getElementById("policy").textContent =
  `policy ${policy.policyId} v${policy.version}: ${policy.labels.length} choices, verified against the pinned root`;
window.fedldpDemo = { sent: 0 };

async function send() {
  const result = await client.flush();
  window.fedldpDemo.sent += result.accepted + result.duplicate;
  say(`sent: ${result.accepted} accepted, ${result.duplicate} duplicate, ${result.pending} pending`);
}

for (const label of policy.labels) {
  const button = document.createElement("button");
  button.textContent = label;
  button.dataset.label = label;
  button.addEventListener("click", async () => {
    try {
      await client.record(config.metric, label);
      say(`recorded one randomized report (${client.pendingReports().length} pending)`);
      await send();
    } catch (error) {
      say(`${error.name}: ${error.message}`);
    }
  });
  document.getElementById("choices").append(button);
}
document.getElementById("flush").addEventListener("click", () => send().catch((e) => say(String(e))));
window.fedldpDemo.ready = true;
