#!/usr/bin/env bash
# pipetrain beside PyTorch on the same model, data shape, batch and threads, in one run, for each
# of three models, one compute thread per process, SGD:
#   mlp    the deep benchmark MLP (examples/deep_mlp.textproto), B=256, M=8, synthetic data.
#   gpt    a GPT of 4 blocks, d=256, 8 heads, context 128 (bench/gpt_peer.textproto; issue 31's
#          shapes), B=32, M=4, the bundled text (76 byte values).
#   llama  the LLaMA-style model of the same shapes (bench/llama_peer.textproto: 4 kv heads,
#          SwiGLU 768, RoPE), B=32, M=4, the bundled text.
#
#   PyTorch  bench/torch_peer.py --model mlp|gpt|llama: a plain single-process loop (nanoGPT style
#            for the transformers), and a hand-rolled 1F1B over torch.distributed (gloo, 2 ranks on
#            127.0.0.1) — as a PyTorch user runs it, and with each rank pinned to a CPU of its own
#            (--pin), as `pipetrain local` pins its workers.
#   pipetrain `reference` (one process) and `local --stages 2` with every schedule.
#
# Every figure is samples/s in the steady state: B * (N - 1) / (the time of steps 2..N). PyTorch
# times steps 2..N itself between barriers; pipetrain's is the wall time of an N-step run minus
# that of a 1-step run (bench/local_throughput.sh), which cancels start-up and evaluation the same
# way. The runs are interleaved round by round and each figure is the best of ROUNDS, because the
# machine is shared and noisy. Ratios: pipetrain reference / PyTorch single-process, pipetrain
# S=2 / PyTorch 1F1B (and / the pinned PyTorch 1F1B in the last column). Not a CI test (docs/performance.md, "PyTorch peer").
#
# Usage: bench/peer_bench.sh [BUILD_DIR] [STEPS] [ROUNDS] [MODELS]
#   (defaults: build 25 3 "mlp gpt llama"; the transformers run STEPS/2 steps, at least 4)
# Env: SCHEDULES, the pipetrain S=2 schedules to run (default: all six).
# Needs Debian's python3-torch; without it the PyTorch rows are skipped with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps_arg=${2:-25}
rounds=${3:-3}
models=${4:-mlp gpt llama}
pipetrain=$build/client/pipetrain
if [[ ! -x $pipetrain ]]; then
  echo "peer_bench: $pipetrain not found; run scripts/build.sh first" >&2
  exit 2
fi

# set_model NAME: the shapes, pipetrain flags and step count of one model.
set_model() {
  case $1 in
    mlp)
      label="deep MLP 256-16x512-16"
      batch=256 microbatches=8 steps=$steps_arg
      common=(--model examples/deep_mlp.textproto --data synthetic) ;;
    gpt | llama)
      label="$1 4 blocks d=256 8 heads context 128 (bench/$1_peer.textproto)"
      batch=32 microbatches=4 steps=$((steps_arg / 2 > 4 ? steps_arg / 2 : 4))
      common=(--model "bench/$1_peer.textproto" --data text) ;;
    *)
      echo "peer_bench: unknown model '$1' (mlp, gpt or llama)" >&2
      exit 2 ;;
  esac
  common+=(--batch "$batch" --microbatches "$microbatches" --seed 1 --optimizer sgd:lr=0.01
           --threads 1 --json)
}
for model in $models; do set_model "$model"; done  # validates MODELS before any run

# A Python that has torch (Debian's python3-torch is for /usr/bin/python3), or none.
torch_python=""
for py in python3 /usr/bin/python3; do
  if command -v "$py" >/dev/null && "$py" -c "import torch" >/dev/null 2>&1; then
    torch_python=$py
    break
  fi
done
if [[ -z $torch_python ]]; then
  echo "peer_bench: PyTorch is missing (apt-get install python3-torch); skipping the PyTorch rows" >&2
fi

# PyTorch's products go to Debian's OpenBLAS, which picks its kernels by CPU model and falls back
# to old SSE3 (Prescott) kernels on VMs with a generic CPU model (docs/performance.md, math_bench):
# give PyTorch the best OpenBLAS core this CPU runs (an inherited OPENBLAS_CORETYPE is ignored;
# TORCH_OPENBLAS_CORETYPE overrides the choice).
torch_coretype=${TORCH_OPENBLAS_CORETYPE:-}
if [[ -z $torch_coretype ]]; then
  if grep -qw avx512f /proc/cpuinfo; then
    torch_coretype=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo; then
    torch_coretype=Haswell
  fi
fi

now() { date +%s.%N; }
calc() { python3 -c "print($1)"; }

# pipetrain_sps COMMAND...: steady-state samples/s of a pipetrain command.
pipetrain_sps() {
  local t0 t1 t2
  t0=$(now)
  "$@" "${common[@]}" --steps "$steps" >/dev/null 2>&1
  t1=$(now)
  "$@" "${common[@]}" --steps 1 >/dev/null 2>&1
  t2=$(now)
  calc "'%.1f' % ($batch * ($steps - 1) / max(1e-9, ($t1 - $t0) - ($t2 - $t1)))"
}
# torch_sps MODE: samples/s PyTorch reports.
torch_sps() {
  OPENBLAS_CORETYPE=$torch_coretype OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
    "$torch_python" bench/torch_peer.py --model "$model" --mode "$@" --batch "$batch" \
    --microbatches "$microbatches" --steps "$steps" | awk '/^samples_per_s/ {print $2}'
}

runs=("torch single" "torch 1f1b" "torch 1f1b --pin" "reference")
schedules=${SCHEDULES:-gpipe 1f1b interleaved zb-h1 zb-v dualpipe-v}
for kind in $schedules; do runs+=("local $kind"); done
declare -A best
for ((r = 1; r <= rounds; ++r)); do
  for model in $models; do
    set_model "$model"
    for run in "${runs[@]}"; do
      case $run in
        "torch "*)
          [[ -z $torch_python ]] && continue
          # shellcheck disable=SC2086  # "1f1b --pin" is two arguments.
          sps=$(torch_sps ${run#torch }) ;;
        reference) sps=$(pipetrain_sps "$pipetrain" reference --eval-samples 1) ;;
        "local "*) sps=$(pipetrain_sps "$pipetrain" local --stages 2 --schedule "${run#local }") ;;
      esac
      [[ -z $sps ]] && continue  # e.g. --pin on a single CPU: torch_peer.py says why.
      if [[ -z ${best[$model:$run]:-} ]] || (($(calc "int($sps > ${best[$model:$run]})"))); then
        best[$model:$run]=$sps
      fi
    done
  done
done

[[ -n $torch_python ]] && echo "PyTorch $("$torch_python" -c 'import torch; print(torch.__version__)')," \
  "OpenBLAS core ${torch_coretype:-auto}"
row() {  # row LABEL RUN PEER_RUN [PINNED_PEER_RUN]
  local sps=${best[$model:$2]:-} peer=${best[$model:$3]:-} pinned="" ratio="-" ratio_pinned=""
  [[ -n ${4:-} ]] && pinned=${best[$model:${4:-}]:-}
  [[ -z $sps ]] && return
  [[ -n $peer ]] && ratio=$(calc "'%.2f' % ($sps / $peer)")
  [[ -n ${4:-} ]] && ratio_pinned="-"
  [[ -n ${4:-} && -n $pinned ]] && ratio_pinned=$(calc "'%.2f' % ($sps / $pinned)")
  printf "%-36s %10s %11s %11s\n" "$1" "$sps" "$ratio" "$ratio_pinned"
}
for model in $models; do
  set_model "$model"
  echo
  echo "$label, B=$batch, M=$microbatches, SGD, 1 compute thread per process, $(nproc) cores," \
    "steps 2..$steps, best of $rounds interleaved rounds"
  printf "%-36s %10s %11s %11s\n" "run" "samples/s" "vs PyTorch" "vs pinned"
  row "PyTorch single process" "torch single" "torch single"
  row "pipetrain reference" "reference" "torch single"
  row "PyTorch 1F1B, gloo, 2 ranks" "torch 1f1b" "torch 1f1b" "torch 1f1b --pin"
  row "PyTorch 1F1B, gloo, 2 ranks, pinned" "torch 1f1b --pin" "torch 1f1b" "torch 1f1b --pin"
  for kind in $schedules; do
    row "pipetrain local S=2 $kind" "local $kind" "torch 1f1b" "torch 1f1b --pin"
  done
done
