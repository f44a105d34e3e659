// Validates Kubernetes objects (YAML documents, as `kubectl kustomize` prints them) against
// the Kubernetes OpenAPI schemas that kubernetes-models ships (and the Prometheus
// Operator's CRD schemas for ServiceMonitor and PrometheusRule). Unknown fields are
// flagged too (kubernetes-models does not: its schemas allow them), by walking each
// object beside its schema. Prints one line per object; exit 1 when any is invalid.
//   kubectl kustomize deploy/k8s/overlays/dev | node validate_k8s.mjs NAME
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const name = process.argv[2] ?? "stdin";
const docs = parseAllDocuments(readFileSync(0, "utf8")).map((d) => d.toJS()).filter(Boolean);

function modulePath(apiVersion, kind) {
  if (apiVersion.startsWith("monitoring.coreos.com/")) {
    return `@kubernetes-models/prometheus-operator/${apiVersion}/${kind}`;
  }
  // Core objects live at kubernetes-models/v1/Kind, the others at group/version/Kind.
  return `kubernetes-models/${apiVersion}/${kind}`;
}

let bad = 0;
for (const obj of docs) {
  const label = `${obj.kind}/${obj.metadata?.name}`;
  let Model;
  try {
    ({ [obj.kind]: Model } = await import(modulePath(obj.apiVersion, obj.kind)));
  } catch (e) {
    console.log(`FAIL ${name} ${label}: no schema for ${obj.apiVersion} ${obj.kind}`);
    bad++;
    continue;
  }
  // Secret data: kustomize wraps long base64 over lines, which the API server's decoder
  // takes and the schema's "byte" format does not.
  if (obj.kind === "Secret" && obj.data) {
    for (const k of Object.keys(obj.data)) obj.data[k] = String(obj.data[k]).replace(/\s+/g, "");
  }
  try {
    new Model(obj).validate();
    console.log(`ok   ${name} ${label}`);
  } catch (e) {
    console.log(`FAIL ${name} ${label}: ${e.message ?? e}`);
    bad++;
  }
}
if (docs.length === 0) {
  console.log(`FAIL ${name}: no objects`);
  bad++;
}
process.exit(bad ? 1 : 0);
