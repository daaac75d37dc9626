#!/usr/bin/env bash
# Kubernetes manifests test (CTest `kubernetes_manifests`): `kubectl kustomize` renders every
# overlay of deploy/kubernetes, and deploy/kubernetes/validate/validate.mjs checks every rendered
# object against the Kubernetes API schemas (npm kubernetes-models) and pipetrain's policy
# (probes, resources, non-root restricted security context). Then two broken renderings must be
# refused, so the validator is known to catch what it claims. Offline apart from the first
# `npm ci` (the npm registry), cached in BUILD_DIR/kubernetes-validate.
# Usage: kubernetes_test.sh BUILD_DIR SOURCE_DIR. Exit 77 (skipped) without kubectl or node/npm.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
for tool in kubectl node npm; do
  if ! command -v "$tool" >/dev/null; then
    echo "kubernetes_test: SKIP: $tool is not installed (kubectl with kustomize, Node.js and npm are needed)"
    exit 77
  fi
done
validator=$build/kubernetes-validate
mkdir -p "$validator"
# Install the pinned validator dependencies once per lock file.
if ! cmp -s "$src/deploy/kubernetes/validate/package-lock.json" "$validator/package-lock.json" ||
  [[ ! -d $validator/node_modules ]]; then
  cp "$src/deploy/kubernetes/validate/package.json" "$src/deploy/kubernetes/validate/package-lock.json" "$validator/"
  (cd "$validator" && timeout 300 npm ci --no-audit --no-fund --loglevel=error) ||
    { echo "kubernetes_test: FAIL: npm ci of the validator's dependencies"; exit 1; }
fi
cp "$src/deploy/kubernetes/validate/validate.mjs" "$validator/"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

overlays=0
for dir in "$src"/deploy/kubernetes/overlays/*/; do
  name=$(basename "$dir")
  kubectl kustomize "$dir" >"$tmp/$name.yaml" || { echo "kubernetes_test: FAIL: kustomize $name"; exit 1; }
  node "$validator/validate.mjs" "$name" <"$tmp/$name.yaml" || { echo "kubernetes_test: FAIL: $name"; exit 1; }
  # The client Job's pipeline (stages x replicas) must fit on the overlay's workers.
  workers=$(awk '/^kind: StatefulSet/{s=1} /^---/{s=0} s && /^  name: pipetrain-worker$/{w=1}
    s && w && /^  replicas:/{print $2; exit}' "$tmp/$name.yaml")
  stages=$({ grep -oE -- '--stages=[0-9]+' "$tmp/$name.yaml" || true; } | tail -1 | cut -d= -f2)
  replicas=$({ grep -oE -- '--replicas=[0-9]+' "$tmp/$name.yaml" || true; } | tail -1 | cut -d= -f2)
  if [[ -z $workers || -z $stages ]] || ((stages * ${replicas:-1} > workers)); then
    echo "kubernetes_test: FAIL: $name: a job of ${stages:-?} stages x ${replicas:-1} replicas on ${workers:-?} workers"
    exit 1
  fi
  overlays=$((overlays + 1))
done
[[ $overlays -ge 3 ]] || { echo "kubernetes_test: FAIL: expected the dev, prod and replicas overlays"; exit 1; }

# The validator must refuse a schema violation and a container without a readiness probe.
sed 's/^  replicas: 2$/  replicas: "two"/' "$tmp/dev.yaml" >"$tmp/bad-schema.yaml"
sed '/readinessProbe:/,/timeoutSeconds: 3/d' "$tmp/dev.yaml" >"$tmp/bad-policy.yaml"
for bad in bad-schema bad-policy; do
  cmp -s "$tmp/dev.yaml" "$tmp/$bad.yaml" && { echo "kubernetes_test: FAIL: $bad is not broken"; exit 1; }
  if node "$validator/validate.mjs" "$bad" <"$tmp/$bad.yaml" >/dev/null 2>"$tmp/$bad.err"; then
    echo "kubernetes_test: FAIL: the validator accepted $bad"; exit 1
  fi
  grep -q FINDING "$tmp/$bad.err" || { echo "kubernetes_test: FAIL: $bad: no finding"; exit 1; }
done
echo "kubernetes_test: $overlays overlays render and validate; broken renderings are refused"
