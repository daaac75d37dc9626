#!/usr/bin/env bash
# pipetrain `reference` beside PyTorch's single-process loop (bench/torch_peer.py --mode single)
# in CPU time instead of wall time: for a machine too loaded for bench/peer_bench.sh's wall-clock
# figures (one compute thread each, so CPU seconds are the work done; cache and core sharing still
# inflate them, less than time-slicing inflates wall time). Same models, shapes and flags as
# peer_bench.sh. Samples/s = B * (N - 1) / CPU seconds of steps 2..N: PyTorch measures its own
# process time; pipetrain's is the user+system time of an N-step run minus that of a 1-step run.
# The runs are interleaved round by round; each figure is the best of ROUNDS.
#
# Usage: bench/peer_cpu_bench.sh [BUILD_DIR] [STEPS] [ROUNDS] [MODELS]   (defaults: build 6 3 "gpt llama")
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-6}
rounds=${3:-3}
models=${4:-gpt llama}
pipetrain=$build/client/pipetrain
[[ -x $pipetrain ]] || { echo "peer_cpu_bench: $pipetrain not found" >&2; exit 2; }
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "peer_cpu_bench: needs python3-torch" >&2; exit 2; }
coretype=$(grep -qw avx512f /proc/cpuinfo && echo SkylakeX || echo Haswell)
calc() { python3 -c "print($1)"; }
cpu_seconds() {  # cpu_seconds COMMAND...: user+system seconds of the command.
  /usr/bin/time -f "%U %S" -o /tmp/peer_cpu_bench.$$ "$@" >/dev/null 2>&1
  awk '{print $1 + $2}' /tmp/peer_cpu_bench.$$
}
declare -A best
for ((r = 1; r <= rounds; ++r)); do
  for model in $models; do
    case $model in
      mlp) batch=256 m=8 spec=examples/deep_mlp.textproto data=synthetic ;;
      gpt | llama) batch=32 m=4 spec=bench/${model}_peer.textproto data=text ;;
      *) echo "peer_cpu_bench: unknown model '$model'" >&2; exit 2 ;;
    esac
    torch=$(OPENBLAS_CORETYPE=$coretype OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 \
      bench/torch_peer.py --model "$model" --mode single --batch "$batch" --microbatches "$m" \
      --steps "$steps" | awk '/^cpu_samples_per_s/ {print $2}')
    flags=(reference --model "$spec" --data "$data" --batch "$batch" --microbatches "$m" --seed 1
           --optimizer sgd:lr=0.01 --threads 1 --eval-samples 1)
    long=$(cpu_seconds "$pipetrain" "${flags[@]}" --steps "$steps")
    short=$(cpu_seconds "$pipetrain" "${flags[@]}" --steps 1)
    ours=$(calc "'%.1f' % ($batch * ($steps - 1) / max(1e-9, $long - $short))")
    for k in "$model:torch:$torch" "$model:ours:$ours"; do
      key=${k%:*} v=${k##*:}
      if [[ -z ${best[$key]:-} ]] || (($(calc "int($v > ${best[$key]})"))); then best[$key]=$v; fi
    done
  done
done
rm -f /tmp/peer_cpu_bench.$$
echo "CPU-time samples/s, steps 2..$steps, best of $rounds interleaved rounds, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-8s %14s %14s %8s\n" model "PyTorch single" "reference" ratio
for model in $models; do
  printf "%-8s %14s %14s %8s\n" "$model" "${best[$model:torch]}" "${best[$model:ours]}" \
    "$(calc "'%.2f' % (${best[$model:ours]} / ${best[$model:torch]})")"
done
