// Validates rendered Kubernetes manifests offline (docs/deploy.md, "Validation"):
//  1. every object against the Kubernetes API schemas — the kubernetes-models constructors'
//     validate() (JSON schemas generated from the Kubernetes OpenAPI spec);
//  2. pipetrain's policy: every container of a Deployment/StatefulSet has startup, liveness and
//     readiness probes; every container (Jobs too) has CPU and memory requests and limits and a
//     restricted security context (runAsNonRoot, no privilege escalation, read-only root file
//     system, all capabilities dropped); pods do not mount a service-account token.
// Usage: node validate.mjs NAME < rendered.yaml   Prints one line per object; exit 1 on a finding.
import { parseAllDocuments } from "yaml";
import { readFileSync } from "node:fs";

const name = process.argv[2] ?? "stdin";
const docs = parseAllDocuments(readFileSync(0, "utf8"))
  .map((d) => d.toJS())
  .filter((o) => o);
const findings = [];
const fail = (obj, what) => findings.push(`${name}: ${obj.kind}/${obj.metadata?.name}: ${what}`);

// The kubernetes-models class of an object: module "kubernetes-models/<apiVersion>/<kind>"
// ("v1/Service", "apps/v1/StatefulSet", "networking.k8s.io/v1/NetworkPolicy").
async function modelFor(obj) {
  const mod = await import(`kubernetes-models/${obj.apiVersion}/${obj.kind}`).catch(() => null);
  return mod?.[obj.kind] ?? null;
}

function podSpecOf(obj) {
  switch (obj.kind) {
    case "Deployment":
    case "StatefulSet":
    case "DaemonSet":
    case "Job":
      return obj.spec?.template?.spec;
    case "CronJob":
      return obj.spec?.jobTemplate?.spec?.template?.spec;
    case "Pod":
      return obj.spec;
    default:
      return null;
  }
}

function checkPolicy(obj) {
  const pod = podSpecOf(obj);
  if (!pod) return;
  const longRunning = obj.kind !== "Job" && obj.kind !== "CronJob";
  if (pod.automountServiceAccountToken !== false) fail(obj, "mounts a service-account token");
  if (pod.securityContext?.runAsNonRoot !== true) {
    fail(obj, "pod securityContext.runAsNonRoot is not true");
  }
  for (const c of [...(pod.initContainers ?? []), ...(pod.containers ?? [])]) {
    const where = `container ${c.name}`;
    if (longRunning) {
      for (const probe of ["startupProbe", "livenessProbe", "readinessProbe"]) {
        if (!c[probe]) fail(obj, `${where} has no ${probe}`);
      }
    }
    for (const kind of ["requests", "limits"]) {
      for (const r of ["cpu", "memory"]) {
        if (!c.resources?.[kind]?.[r]) fail(obj, `${where} has no resources.${kind}.${r}`);
      }
    }
    const sc = c.securityContext ?? {};
    if (sc.runAsNonRoot !== true) fail(obj, `${where} may run as root`);
    if (sc.allowPrivilegeEscalation !== false) fail(obj, `${where} allows privilege escalation`);
    if (sc.readOnlyRootFilesystem !== true) fail(obj, `${where} has a writable root file system`);
    if (!(sc.capabilities?.drop ?? []).includes("ALL")) fail(obj, `${where} keeps capabilities`);
    if (sc.privileged) fail(obj, `${where} is privileged`);
  }
}

if (docs.length === 0) findings.push(`${name}: no objects`);
for (const obj of docs) {
  const Model = await modelFor(obj);
  if (!Model) {
    fail(obj, `no schema for ${obj.apiVersion} ${obj.kind}`);
    continue;
  }
  try {
    new Model(obj).validate();
  } catch (e) {
    fail(obj, `schema: ${e.message}`);
    continue;
  }
  checkPolicy(obj);
  console.log(`${name}: ${obj.apiVersion} ${obj.kind}/${obj.metadata.name} ok`);
}
for (const f of findings) console.error(`FINDING ${f}`);
console.log(`${name}: ${docs.length} objects, ${findings.length} findings`);
process.exit(findings.length === 0 ? 0 : 1);
