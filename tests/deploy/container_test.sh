#!/usr/bin/env bash
# Container test (CTest `container_job`): an image of the three binaries, built with podman from
# local files only (no registry: FROM scratch, a root file system assembled from
# `cmake --install --component runtime` of this build plus the exact shared libraries the
# binaries load, and a passwd entry for the non-root user 10001 — the runtime stage of
# deploy/Dockerfile); then a coordinator, two workers and `pipetrain train` each run in their own
# container (host network, 127.0.0.1 only), and the job's losses and checkpoint files must equal
# the host's `pipetrain reference` byte for byte.
# Usage: container_test.sh BUILD_DIR SOURCE_DIR. Exit 77 (skipped) where podman is missing or
# cannot run containers here (the reason is printed). About 20 s.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
skip() { echo "container_test: SKIP: $*"; exit 77; }
fail() { echo "container_test: FAIL: $*" >&2; exit 1; }
command -v podman >/dev/null || skip "podman is not installed (apt-get install podman runc)"

tmp=$(mktemp -d)
image=localhost/pipetrain-test:$$
pids=()
names=()
cleanup() {
  for n in "${names[@]}"; do podman rm -f "$n" >/dev/null 2>&1 || true; done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  podman rmi -f "$image" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# The image's root file system.
root=$tmp/root
DESTDIR=$root cmake --install "$build" --prefix /usr --component runtime >"$tmp/install.log"
# The binaries' libraries and those of the tokenizers' SentencePiece module (opened with dlopen,
# so ldd of a binary does not list them: common/io/sentencepiece_model.h).
for file in bin/coordinator bin/stage_worker bin/pipetrain lib/pipetrain/libpipetrain_sentencepiece.so; do
  ldd "$root/usr/$file" | grep -o '/[^ ]*' | sort -u
done | sort -u | while read -r lib; do cp --parents -L "$lib" "$root/"; done
mkdir -p "$root/etc" "$root/tmp" "$root/var/lib/pipetrain"
chmod 1777 "$root/tmp"
echo "pipetrain:x:10001:10001::/var/lib/pipetrain:/usr/sbin/nologin" >"$root/etc/passwd"
echo "pipetrain:x:10001:" >"$root/etc/group"
printf 'FROM scratch\nCOPY root/ /\nENV OMP_WAIT_POLICY=passive\nUSER 10001:10001\n' >"$tmp/Containerfile"
timeout 300 podman build -q -t "$image" -f "$tmp/Containerfile" "$tmp" >"$tmp/build.log" 2>&1 ||
  { cat "$tmp/build.log"; skip "podman cannot build an image here"; }

# How containers run here: podman's defaults first, then with runc and this sandbox's limits.
run_opts=()
for opts in "" "--runtime runc --ulimit nofile=4096:4096 --ulimit nproc=4096:4096"; do
  read -r -a try <<<"$opts"
  # What matters is that the binary ran in the container: its --help lists its flags.
  out=$(timeout 60 podman run --rm "${try[@]}" "$image" /usr/bin/stage_worker --help 2>&1 || true)
  echo "$out" >>"$tmp/probe.log"
  if grep -q -- "--coordinator" <<<"$out"; then
    run_opts=("${try[@]}" --network host)
    break
  fi
done
((${#run_opts[@]} > 0)) || skip "podman cannot run containers here: $(tail -3 "$tmp/probe.log")"

ckpt=$tmp/ckpt
mkdir -p "$ckpt" && chmod 777 "$ckpt"
# A daemon in a container named $1 (removed when the test ends), output to $tmp/$1.log.
start() {
  local name=$1
  shift
  names+=("$name")
  podman run --rm --name "$name" "${run_opts[@]}" -v "$ckpt:$ckpt" "$image" "$@" >"$tmp/$name.log" 2>&1 &
  pids+=($!)
}
cname=pt-coordinator-$$
start "$cname" /usr/bin/coordinator --listen 127.0.0.1:0 --checkpoint-root "$ckpt"
for _ in $(seq 300); do
  grep -q "coordinator listening on" "$tmp/$cname.log" && break
  sleep 0.1
done
address=$(sed -n 's/^coordinator listening on //p' "$tmp/$cname.log" | head -1)
[[ -n $address ]] || { cat "$tmp/$cname.log"; fail "the coordinator did not start in its container"; }
for w in 0 1; do
  start "pt-worker$w-$$" /usr/bin/stage_worker --coordinator "$address" --listen 127.0.0.1:0 --name "w$w"
done

train=(--model /usr/share/pipetrain/examples/mlp_digits.textproto --data digits --steps 8
  --batch 32 --microbatches 4 --seed 5 --optimizer adamw:lr=1e-2 --json)
names+=("pt-client-$$")
# Both workers registered (each measures its GFLOP/s first): the coordinator logs each.
for _ in $(seq 600); do
  [[ $(grep -c "registered from" "$tmp/$cname.log") -ge 2 ]] && break
  sleep 0.1
done
[[ $(grep -c "registered from" "$tmp/$cname.log") -ge 2 ]] ||
  { cat "$tmp"/pt-*.log; fail "the workers did not register within 60 s"; }
timeout 180 podman run --rm --name "pt-client-$$" "${run_opts[@]}" -v "$ckpt:$ckpt" "$image" \
  /usr/bin/pipetrain train --coordinator "$address" --stages 2 --schedule 1f1b "${train[@]}" \
  --save "$ckpt/run" --eval-samples 0 >"$tmp/train.json" 2>"$tmp/train.err" ||
  { cat "$tmp/train.err" "$tmp"/pt-*.log; fail "pipetrain train in a container"; }
PIPETRAIN_DATA_DIR=$src/data "$build/client/pipetrain" reference \
  --model "$src/examples/mlp_digits.textproto" "${train[@]:2}" --save "$tmp/reference" \
  --eval-samples 0 >"$tmp/reference.json" 2>"$tmp/reference.err" ||
  { cat "$tmp/reference.err"; fail "pipetrain reference on the host"; }
# The loss and evaluation values as printed (train adds timings, which differ by nature).
values() {
  python3 -c 'import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print({k: r[k] for k in ("step", "loss", "eval_loss", "eval_accuracy") if k in r})' "$1"
}
values "$tmp/train.json" >"$tmp/train.values"
values "$tmp/reference.json" >"$tmp/reference.values"
[[ $(grep -c step "$tmp/reference.values") == 8 ]] || fail "expected 8 steps: $(cat "$tmp/reference.json")"
cmp -s "$tmp/train.values" "$tmp/reference.values" ||
  { diff "$tmp/train.values" "$tmp/reference.values" | head; fail "the losses differ"; }
diff -r "$ckpt/run" "$tmp/reference" >/dev/null ||
  { diff -r "$ckpt/run" "$tmp/reference" | head; fail "the checkpoint files differ"; }
echo "container_test: a job in containers equals pipetrain reference byte for byte ($(grep -c '"step"' "$tmp/train.json") steps, $(ls "$ckpt/run" | wc -l) checkpoint files)"
