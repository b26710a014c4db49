// The browser test page: records through the SDK's browser bundle into the collector's web
// endpoint. Parameters come in the URL's fragment (JSON); the outcome is window.__result.
//   mode "record": record `labels` (each once) and close without flushing (noClose: not even close)
//   mode "flush":  flush what the outbox holds; dump the IndexedDB state
//   mode "legacy": record `labels`, copy the state into a version-1 database, flush from that
//   mode "bench":  time `n` record() calls (randomize + persist to IndexedDB), each
//                  followed by a bare IndexedDB transaction (the reference)
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

/** The reference: a database where put(i) is one bare transaction of one small add (the page's durability), timed (ms). */
async function bareTransactions() {
  const opening = indexedDB.open(`${params.database}-floor`, 1);
  opening.onupgradeneeded = () => opening.result.createObjectStore("s", { autoIncrement: true });
  const db = await new Promise((resolve, reject) => { opening.onsuccess = () => resolve(opening.result); opening.onerror = reject; });
  return {
    async put(i) {
      const t = performance.now();
      const tx = db.transaction("s", "readwrite", { durability: params.durability ?? "strict" });
      tx.objectStore("s").add({ id: i, report: "0a".repeat(40) });
      tx.commit();
      await new Promise((resolve, reject) => { tx.oncomplete = resolve; tx.onerror = reject; });
      return performance.now() - t;
    },
    close: () => db.close(),
  };
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
  if (params.mode === "legacy") {
    // A version-1 database (the whole state in "state", no "log"), as the SDK wrote before:
    // the state recorded here is copied into one; a client opening it must send its reports.
    for (const label of params.labels) await client.record(params.metric, label);
    await client.close();
    const store = await sdk.IndexedDBStore.open(params.database);
    const state = await store.load();
    store.close();
    const opening = indexedDB.open(`${params.database}-v1`, 1);
    opening.onupgradeneeded = () => opening.result.createObjectStore("state");
    const db = await new Promise((resolve, reject) => { opening.onsuccess = () => resolve(opening.result); opening.onerror = reject; });
    const tx = db.transaction("state", "readwrite");
    tx.objectStore("state").put(state, "device");
    await new Promise((resolve, reject) => { tx.oncomplete = resolve; tx.onerror = reject; });
    db.close();
    const upgraded = await sdk.openBrowserClient({
      collectorUrl: params.collectorUrl, protocol: params.protocol, token: params.token,
      pinnedRootKeys: params.pinnedRootKeys.map(sdk.fromHex), rootEnvelope: sdk.fromHex(params.rootEnvelope),
      database: `${params.database}-v1`,
    });
    const pending = upgraded.pendingReports().length;
    const flushed = await upgraded.flush();
    await upgraded.close();
    return { pending, flushed };
  }
  if (params.mode === "flush") {
    const flushed = await client.flush();
    await client.close();
    return { flushed, state: await dumpState() };
  }
  // record() calls, each followed by one bare IndexedDB transaction (the storage floor,
  // interleaved so both meet the same disk); reports/s from the record() times alone.
  const times = [];
  const floor = await bareTransactions();
  const floorTimes = [];
  for (let i = 0; i < params.n; i++) {
    const t = performance.now();
    await client.record(params.metric, params.labels[i % params.labels.length]);
    times.push(performance.now() - t);
    floorTimes.push(await floor.put(i));
  }
  floor.close();
  const seconds = times.reduce((a, b) => a + b, 0) / 1000;
  // perturb() alone, timed in batches (the page clock's resolution is coarse): ms per call.
  const mechanism = client.policy(params.metric).mechanism;
  const perturbTimes = [];
  for (let batch = 0; batch < 5; batch++) {
    const t = performance.now();
    for (let i = 0; i < 2000; i++) mechanism.perturb(i % params.labels.length);
    perturbTimes.push((performance.now() - t) / 2000);
  }
  await client.close();
  return { times, perturbTimes, reportsPerSecond: params.n / seconds, floorTimes };
}

try {
  window.__result = { ok: true, ...(await run()) };
  status.textContent = "done";
} catch (error) {
  window.__result = { ok: false, error: `${error.name}: ${error.message}`, code: error.code };
  status.textContent = "failed";
}
