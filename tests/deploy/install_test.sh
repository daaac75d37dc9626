#!/usr/bin/env bash
# Install test (CTest `install_*`): `cmake --install` of the build into a temporary prefix, then
#  - the installed `pipetrain local` (2 stages, 1F1B) trains the installed example on the
#    installed bundled data, from a directory outside the source tree with $PIPETRAIN_DATA_DIR
#    unset, and its losses equal the installed `pipetrain reference`'s bit for bit;
#  - no installed binary holds the source tree's data path;
#  - the installed `pipetrain tokenizer train` finds the installed SentencePiece module
#    (lib/pipetrain, docs/tokenizer.md);
#  - with `sdk`: a program built against the installed SDK (find_package(pipetrain)) talks to
#    the installed coordinator.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR [sdk]
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
mode=${3:-local}
tmp=$(mktemp -d)
coordinator_pid=""
cleanup() {
  if [[ -n $coordinator_pid ]]; then kill "$coordinator_pid" 2>/dev/null || true; wait "$coordinator_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }

prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
for f in bin/pipetrain bin/coordinator bin/stage_worker share/pipetrain/data/digits.csv.gz \
  share/pipetrain/data/gpl-3.txt share/pipetrain/examples/mlp_digits.textproto \
  include/pipetrain/client/sdk/client.h include/pipetrain/pipetrain/v1/coordinator.grpc.pb.h \
  lib/cmake/pipetrain/pipetrain-config.cmake lib/pipetrain/libpipetrain_sentencepiece.so; do
  [[ -e $prefix/$f ]] || fail "$f was not installed"
done
for b in pipetrain coordinator stage_worker; do
  if grep -qaF "$src/data" "$prefix/bin/$b"; then fail "bin/$b holds the source path $src/data"; fi
done
cd "$tmp"
unset PIPETRAIN_DATA_DIR PIPETRAIN_SOURCE_DIR

if [[ $mode == local ]]; then
  timeout 120 "$prefix/bin/pipetrain" tokenizer train --input "$prefix/share/pipetrain/data/gpl-3.txt" \
    --vocab-size 200 --out tok >tokenizer.out 2>&1 || { cat tokenizer.out; fail "installed pipetrain tokenizer train"; }
  [[ -s tok/tokenizer.model ]] || fail "tokenizer train wrote no tok/tokenizer.model"
  train=(--model "$prefix/share/pipetrain/examples/mlp_digits.textproto" --data digits --steps 6
    --batch 32 --microbatches 4 --seed 7 --optimizer adamw:lr=1e-2 --json)
  timeout 120 "$prefix/bin/pipetrain" reference "${train[@]}" >reference.json 2>reference.err ||
    { cat reference.err; fail "installed pipetrain reference"; }
  timeout 120 "$prefix/bin/pipetrain" local --stages 2 --schedule 1f1b "${train[@]}" >local.json 2>local.err ||
    { cat local.err; fail "installed pipetrain local"; }
  python3 - reference.json local.json <<'PY' || fail "local's losses differ from reference's"
import json, sys
def losses(path):
    return [(r["step"], r["loss"]) for r in map(json.loads, open(path)) if "step" in r]
ref, loc = losses(sys.argv[1]), losses(sys.argv[2])
print("reference", ref, "\nlocal    ", loc)
sys.exit(0 if len(ref) == 6 and ref == loc else 1)
PY
  echo "install_test: installed pipetrain local trains, losses equal reference's"
  exit 0
fi

# sdk: build the consumer against the prefix and run it against the installed coordinator.
cmake -S "$src/tests/deploy/sdk_consumer" -B consumer -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >consumer.log 2>&1 || { cat consumer.log; fail "configure the SDK consumer"; }
timeout 300 cmake --build consumer >>consumer.log 2>&1 || { cat consumer.log; fail "build the SDK consumer"; }
"$prefix/bin/coordinator" --listen 127.0.0.1:0 --port-file "$tmp/port" >coordinator.out 2>coordinator.err &
coordinator_pid=$!
for _ in $(seq 100); do [[ -s $tmp/port ]] && break; sleep 0.1; done
[[ -s $tmp/port ]] || { cat coordinator.err; fail "the installed coordinator did not start"; }
out=$(timeout 30 consumer/sdk_consumer "127.0.0.1:$(cat "$tmp/port")") || fail "sdk_consumer: $out"
[[ $out == "workers: 0" ]] || fail "sdk_consumer printed '$out', expected 'workers: 0'"
echo "install_test: a program built on the installed SDK lists the installed coordinator's workers"
