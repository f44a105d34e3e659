// Type-checks deploy/ objects against published TypeScript types, which catch what the
// run-time schemas let through (unknown fields, a misspelt key): every object is written
// into a generated .ts file as an object literal annotated with its type, and `tsc
// --strict --noEmit` checks them (excess-property checks flag unknown fields).
//   node typecheck.mjs --k8s NAME FILE.yaml ... --dashboard FILE.json ...
// Kubernetes objects: kubernetes-models' interfaces (and the Prometheus Operator's);
// dashboards: @grafana/schema's Dashboard. Prints tsc's errors; exit 1 on any.
import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseAllDocuments } from "yaml";

const here = dirname(fileURLToPath(import.meta.url));
const gen = join(here, "gen");
rmSync(gen, { recursive: true, force: true });
mkdirSync(gen);
const files = [];
const args = process.argv.slice(2);
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--k8s") {
    const name = args[++i], file = args[++i];
    const docs = parseAllDocuments(readFileSync(file, "utf8")).map((d) => d.toJS()).filter(Boolean);
    const imports = new Set(), body = [];
    docs.forEach((obj, n) => {
      const type = `I${obj.kind}`;
      const from = obj.apiVersion.startsWith("monitoring.coreos.com/")
        ? `@kubernetes-models/prometheus-operator/${obj.apiVersion}/${obj.kind}`
        : `kubernetes-models/${obj.apiVersion}/${obj.kind}`;
      const alias = `${type}_${obj.apiVersion.replace(/[^A-Za-z0-9]/g, "_")}`;
      imports.add(`import type { ${type} as ${alias} } from "${from}";`);
      body.push(`// ${obj.kind}/${obj.metadata?.name}\nexport const o${n}: ${alias} = ${JSON.stringify(obj, null, 2)};`);
    });
    const out = join(gen, `k8s_${name}.ts`);
    writeFileSync(out, [...imports, "", ...body].join("\n") + "\n");
    files.push(out);
  } else if (args[i] === "--dashboard") {
    const file = args[++i];
    const out = join(gen, `dashboard_${files.length}.ts`);
    writeFileSync(out, `import type { Dashboard } from "@grafana/schema";\n` +
      `// ${file}\nexport const dashboard: Dashboard = ${readFileSync(file, "utf8")};\n`);
    files.push(out);
  } else {
    console.error(`unknown argument ${args[i]}`);
    process.exit(2);
  }
}
writeFileSync(join(gen, "tsconfig.json"), JSON.stringify({
  compilerOptions: { strict: true, noEmit: true, target: "es2022", module: "nodenext",
                     moduleResolution: "nodenext", skipLibCheck: true },
  files: files.map((f) => f.slice(gen.length + 1)),
}));
try {
  execFileSync(join(here, "node_modules/.bin/tsc"), ["-p", join(gen, "tsconfig.json")],
               { stdio: "inherit" });
  console.log(`types: ${files.length} file(s) check out`);
} catch {
  process.exit(1);
}
