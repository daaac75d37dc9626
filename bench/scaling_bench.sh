#!/usr/bin/env bash
# The scaling table of docs/scaling.md ("How a job scales"): bench/scaling_bench's predicted
# throughput for 8 to 1,024 workers of the deep MLP and gpt_char (per-layer costs timed on this
# host), printed as tables, and a plot of both (with the netns points of bench/scaling_netns.sh
# beside it when NETNS_CSV is given).
# Usage: bench/scaling_bench.sh [BUILD_DIR] [OUT_SVG] [NETNS_CSV]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
svg=${2:-docs/scaling.svg}
netns=${3:-}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

"$build/bench/scaling_bench" --model examples/deep_mlp.textproto --data synthetic \
  --optimizer sgd:lr=0.01 --csv "$out/deep_mlp.csv"
echo
"$build/bench/scaling_bench" --model examples/gpt_char.textproto --csv "$out/gpt_char.csv"
# The Debian python3 has matplotlib (python3-matplotlib); a python3 earlier on PATH may not.
py=python3
for candidate in /usr/bin/python3 python3; do
  if "$candidate" -c "import matplotlib" 2>/dev/null; then py=$candidate; break; fi
done
plot=("$py" bench/scaling_plot.py "$svg" "deep MLP=$out/deep_mlp.csv" "gpt_char=$out/gpt_char.csv")
[[ -n $netns ]] && plot+=(--netns "$netns")
"${plot[@]}"
echo "plot: $svg"
