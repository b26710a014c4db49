// The ESM browser bundles (esbuild, minified, platform browser, code splitting) of src/browser.ts:
//   dist/browser/fedldp.all.min.js      every mechanism the SDK supports
//   dist/browser/fedldp.grr-olh.min.js  GRR and OLH only (src/bundles/mechanisms_grr_olh.ts
//                                        stands in for src/mechanisms.ts's factory)
// Lazy chunks (dist/browser/chunks/) sit beside them and load only when needed.
// `npm run build:browser`; prints each bundle's size up front, minified and gzip -9.
import { build } from "esbuild";
import { readFileSync, rmSync } from "node:fs";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { gzipSync } from "node:zlib";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const outdir = path.join(root, "dist/browser");

/** Resolve policy.ts's import of ./mechanisms.js to the GRR/OLH-only factory. */
const grrOlhOnly = {
  name: "grr-olh-only",
  setup(b) {
    b.onResolve({ filter: /^\.\/mechanisms\.js$/ }, (args) =>
      path.basename(args.importer) === "policy.ts"
        ? { path: path.join(root, "src/bundles/mechanisms_grr_olh.ts") }
        : undefined);
  },
};

/**
 * Resolve "@connectrpc/connect-web" to the one transport module each importer uses
 * (transport_connect.ts: the Connect transport; transport_grpc_web.ts: gRPC-Web), so the
 * package index does not tie the gRPC-Web transport to the entry: it stays in its lazy chunk.
 */
export const connectWebParts = {
  name: "connect-web-parts",
  setup(b) {
    const modules = { "transport_connect.ts": "connect-transport.js", "transport_grpc_web.ts": "grpc-web-transport.js" };
    b.onResolve({ filter: /^@connectrpc\/connect-web$/ }, (args) => {
      const module = modules[path.basename(args.importer)];
      return module ? { path: path.join(root, "node_modules/@connectrpc/connect-web/dist/esm", module) } : undefined;
    });
  },
};

/**
 * The browser bundles speak protobuf binary only (ConnectTransport sets useBinaryFormat), so
 * @bufbuild/protobuf's JSON codec (from-json.js, to-json.js), which connect's serializers
 * reference but never call with binary on, is replaced by functions that throw. A call would
 * mean a JSON-format path was taken: it fails loudly instead of misreading bytes.
 */
export const binaryOnly = {
  name: "protobuf-binary-only",
  setup(b) {
    b.onLoad({ filter: /@bufbuild[\\/]protobuf[\\/]dist[\\/]esm[\\/](from|to)-json\.js$/ }, (args) => {
      const names = /from-json\.js$/.test(args.path)
        ? ["fromJsonString", "mergeFromJsonString", "fromJson", "mergeFromJson", "enumFromJson", "isEnumJson"]
        : ["toJson", "toJsonString", "enumToJson"];
      const body = names.map((n) => `export function ${n}() { throw new Error("protobuf JSON is not in this bundle (binary only)"); }`);
      return { contents: body.join("\n"), loader: "js" };
    });
  },
};

export const BUNDLES = { all: "fedldp.all.min.js", "grr-olh": "fedldp.grr-olh.min.js" };

/** Bytes in `outputs` by origin: this SDK's code, the generated descriptors, each package. */
function partsOf(outputs) {
  const parts = {};
  for (const output of outputs) {
    for (const [input, info] of Object.entries(output.inputs)) {
      const match = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(input);
      const key = match ? match[1] : input.includes("src/gen/") ? "generated descriptors" : "sdk code";
      parts[key] = (parts[key] ?? 0) + info.bytesInOutput;
    }
  }
  return parts;
}

/**
 * Build every bundle (code splitting: chunks under dist/browser/chunks/, loaded by a
 * dynamic import only when needed — @noble/ed25519 where WebCrypto lacks Ed25519, the
 * gRPC-Web transport for protocol "grpc-web"). Per bundle: what a page loads up front
 * (the entry and the chunks it imports statically: minified bytes, and gzip -9 of each
 * file summed), the bytes by origin, and the lazy chunks.
 */
export async function buildBrowser() {
  rmSync(outdir, { recursive: true, force: true });
  const sizes = {};
  for (const [name, file] of Object.entries(BUNDLES)) {
    const result = await build({
      entryPoints: { [file.replace(/\.js$/, "")]: path.join(root, "src/browser.ts") },
      bundle: true, format: "esm", platform: "browser", target: "es2022", splitting: true,
      minify: true, legalComments: "none", outdir, chunkNames: "chunks/[name]-[hash]", logLevel: "warning",
      // ts sources import "./x.js": let esbuild find x.ts
      resolveExtensions: [".ts", ".js"],
      plugins: name === "grr-olh" ? [grrOlhOnly, connectWebParts, binaryOnly] : [connectWebParts, binaryOnly],
      metafile: true,
    });
    const outputs = result.metafile.outputs;
    const key = (f) => path.relative(root, path.resolve(process.cwd(), f));
    const entry = Object.keys(outputs).find((o) => o.endsWith(file));
    const eager = new Set([entry]);
    for (const o of eager) {
      for (const i of outputs[o].imports) if (i.kind === "import-statement" && !i.external) eager.add(i.path);
    }
    const lazy = Object.keys(outputs).filter((o) => !eager.has(o));
    const gz = (o) => gzipSync(readFileSync(path.resolve(process.cwd(), o)), { level: 9 }).length;
    sizes[name] = {
      file: key(entry),
      minified: [...eager].reduce((n, o) => n + outputs[o].bytes, 0),
      gzip: [...eager].reduce((n, o) => n + gz(o), 0),
      files: [...eager].map(key),
      parts: partsOf([...eager].map((o) => outputs[o])),
      lazy: Object.fromEntries(lazy.map((o) => [key(o), { minified: outputs[o].bytes, gzip: gz(o), parts: partsOf([outputs[o]]) }])),
    };
  }
  return sizes;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const sizes = await buildBrowser();
  for (const [name, s] of Object.entries(sizes)) {
    console.log(`${name}: ${s.file} (+${s.files.length - 1} chunks) ${s.minified} B minified, ${s.gzip} B gzip up front; lazy: ${JSON.stringify(s.lazy)}`);
  }
}
