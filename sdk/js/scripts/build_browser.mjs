// The ESM browser bundles (esbuild, minified, platform browser) of src/browser.ts:
//   dist/browser/fedldp.all.min.js      every mechanism the SDK supports
//   dist/browser/fedldp.grr-olh.min.js  GRR and OLH only (src/bundles/mechanisms_grr_olh.ts
//                                        stands in for src/mechanisms.ts's factory)
// `npm run build:browser`; prints each bundle's size, minified and gzip -9.
import { build } from "esbuild";
import { readFileSync } from "node:fs";
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

export const BUNDLES = { all: "fedldp.all.min.js", "grr-olh": "fedldp.grr-olh.min.js" };

export async function buildBrowser() {
  const sizes = {};
  for (const [name, file] of Object.entries(BUNDLES)) {
    const outfile = path.join(outdir, file);
    const parts = await build({
      entryPoints: [path.join(root, "src/browser.ts")],
      bundle: true, format: "esm", platform: "browser", target: "es2022",
      minify: true, legalComments: "none", outfile, logLevel: "warning",
      // ts sources import "./x.js": let esbuild find x.ts
      resolveExtensions: [".ts", ".js"],
      plugins: name === "grr-olh" ? [grrOlhOnly] : [],
      metafile: true,
    }).then((result) => {
      // Minified bytes in the bundle by origin: this SDK's code and each package.
      const parts = {};
      for (const [input, info] of Object.entries(Object.values(result.metafile.outputs)[0].inputs)) {
        const match = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(input);
        const key = match ? match[1] : input.includes("src/gen/") ? "generated descriptors" : "sdk code";
        parts[key] = (parts[key] ?? 0) + info.bytesInOutput;
      }
      return parts;
    });
    const bytes = readFileSync(outfile);
    sizes[name] = { file: path.relative(root, outfile), minified: bytes.length, gzip: gzipSync(bytes, { level: 9 }).length, parts };
  }
  return sizes;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const sizes = await buildBrowser();
  for (const [name, s] of Object.entries(sizes)) console.log(`${name}: ${s.file} ${s.minified} B minified, ${s.gzip} B gzip`);
}
