// The browser test page: records through the SDK's browser bundle into the collector's web
// endpoint. Parameters come in the URL's fragment (JSON); the outcome is window.__result.
//   mode "record": record `labels` (each once) and close without flushing (noClose: not even close)
//   mode "flush":  flush what the outbox holds; dump the IndexedDB state
//   mode "bench":  time `n` record() calls (randomize + persist to IndexedDB)
//   mode "leak":   the broken variant: POST a raw value to the page's origin
const params = JSON.parse(decodeURIComponent(location.hash.slice(1)));
const sdk = await import(`./${params.bundle}`);
const status = document.getElementById("status");

async function open() {
  return sdk.openBrowserClient({
    collectorUrl: params.collectorUrl, protocol: params.protocol, token: params.token,
    pinnedRootKeys: params.pinnedRootKeys.map(sdk.fromHex), rootEnvelope: sdk.fromHex(params.rootEnvelope),
    database: params.database, durability: params.durability,
  });
}

async function dumpState() {
  const store = await sdk.IndexedDBStore.open(params.database);
  try {
    return JSON.stringify(await store.load());
  } finally {
    store.close();
  }
}

/** The reference: `n` bare IndexedDB transactions, each one small put (the page's durability), ms each. */
async function bareTransactions(n) {
  const opening = indexedDB.open(`${params.database}-floor`, 1);
  opening.onupgradeneeded = () => opening.result.createObjectStore("s", { autoIncrement: true });
  const db = await new Promise((resolve, reject) => { opening.onsuccess = () => resolve(opening.result); opening.onerror = reject; });
  const times = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    const tx = db.transaction("s", "readwrite", { durability: params.durability ?? "strict" });
    tx.objectStore("s").add({ id: i, report: "0a".repeat(40) });
    tx.commit();
    await new Promise((resolve, reject) => { tx.oncomplete = resolve; tx.onerror = reject; });
    times.push(performance.now() - t);
  }
  db.close();
  return times;
}

async function run() {
  if (params.mode === "leak") {
    // The broken variant: a page that sends a raw value (the network check must catch it).
    await fetch("./leak", { method: "POST", body: params.label });
    return {};
  }
  const client = await open();
  if (params.mode === "record") {
    for (const label of params.labels) await client.record(params.metric, label);
    const pending = client.pendingReports().length;
    if (params.noClose) return { pending }; // the page goes away without close(): only record()'s own writes hold the reports
    await client.close();
    return { pending };
  }
  if (params.mode === "flush") {
    const flushed = await client.flush();
    await client.close();
    return { flushed, state: await dumpState() };
  }
  const times = [];
  const started = performance.now();
  for (let i = 0; i < params.n; i++) {
    const t = performance.now();
    await client.record(params.metric, params.labels[i % params.labels.length]);
    times.push(performance.now() - t);
  }
  const seconds = (performance.now() - started) / 1000;
  // perturb() alone, timed in batches (the page clock's resolution is coarse): ms per call.
  const mechanism = client.policy(params.metric).mechanism;
  const perturbTimes = [];
  for (let batch = 0; batch < 5; batch++) {
    const t = performance.now();
    for (let i = 0; i < 2000; i++) mechanism.perturb(i % params.labels.length);
    perturbTimes.push((performance.now() - t) / 2000);
  }
  await client.close();
  return { times, perturbTimes, reportsPerSecond: params.n / seconds, floorTimes: await bareTransactions(params.n) };
}

try {
  window.__result = { ok: true, ...(await run()) };
  status.textContent = "done";
} catch (error) {
  window.__result = { ok: false, error: `${error.name}: ${error.message}`, code: error.code };
  status.textContent = "failed";
}
