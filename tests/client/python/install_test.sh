#!/usr/bin/env bash
# The README's offline install of the Python client, in a fresh virtual environment: a copy of
# client/python (as a clone would have it; the source tree stays clean of pip's build files)
# installed with pip, no index and no build isolation, then imported and used outside the
# source tree. Usage: install_test.sh PYTHON3 SOURCE_DIR
set -euo pipefail
python3=$1
source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$source_dir/client/python" "$work/python"
"$python3" -m venv --system-site-packages "$work/venv"
PIPETRAIN_PROTO_DIR="$source_dir/proto" PIPETRAIN_DATA_DIR="$source_dir/data" \
  "$work/venv/bin/pip" install -q --no-build-isolation --no-index "$work/python"
cd "$work"
"$work/venv/bin/python" - <<'PY'
import pipetrain
from pipetrain import data
from pipetrain.v1 import coordinator_pb2, tensor_pb2
assert pipetrain.__file__.startswith(__import__("sys").prefix), pipetrain.__file__
assert coordinator_pb2.DenseTensor(dtype=tensor_pb2.DTYPE_F32).dtype == 1
digits = data.load("digits")  # the bundled copy installed with the package
assert digits.size("train") == 1438
print("installed", pipetrain.__version__, "at", pipetrain.__file__)
PY
