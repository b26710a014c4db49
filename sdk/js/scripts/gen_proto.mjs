// Regenerates src/gen/ (checked in) from ../../proto/fedldp/v1/{policy,collector}.proto
// with buf and protoc-gen-es (both dev dependencies): `npm run gen`.
import { execFileSync } from "node:child_process";
execFileSync("npx", ["buf", "generate"], { stdio: "inherit" });
