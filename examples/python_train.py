#!/usr/bin/env python3
"""Trains the digits MLP over a 2-stage pipeline from Python and plots the loss curve to a PNG.

Notebook style: each block below is a cell. Against running daemons:
    python3 examples/python_train.py --coordinator 127.0.0.1:7070
or with a coordinator and two workers started here from the build tree (build/, else
build-demo/; or --build-dir DIR, or the binaries themselves):
    python3 examples/python_train.py --local
Needs the pipetrain package (docs/python.md, "Install"; without it, the one a build put into
build/python or build-demo/python); plotting needs matplotlib (Debian python3-matplotlib) and is
skipped with a message without it.
"""

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BUILD_DIRS = [os.path.join(REPO, name) for name in ("build", "build-demo")]

try:
    import pipetrain
except ImportError:
    # Not installed: the package a build made (ninja -C build pipetrain_python).
    sys.path[:0] = [os.path.join(d, "python") for d in BUILD_DIRS
                    if os.path.isdir(os.path.join(d, "python", "pipetrain"))][:1]
    try:
        import pipetrain
    except ImportError:
        sys.exit("the pipetrain package is not installed: install it (docs/python.md, "
                 "\"Install\"), or build it into build/python with `ninja -C build "
                 "pipetrain_python`, which this script finds")
from pipetrain import data
from pipetrain.local import LocalCluster

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--coordinator", help="HOST:PORT of a running coordinator")
parser.add_argument("--local", action="store_true",
                    help="start a coordinator and 2 workers on 127.0.0.1 (from --build-dir)")
parser.add_argument("--build-dir",
                    help="the CMake build directory with the daemons (default: build/, else "
                         "build-demo/ of this repository)")
parser.add_argument("--coordinator-binary")
parser.add_argument("--worker-binary")
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--schedule", default="1f1b")
parser.add_argument("--plot", default="loss.png", help="where to write the loss curve")
args = parser.parse_args()
if bool(args.coordinator) == args.local:
    parser.error("give exactly one of --coordinator and --local")


def default_build_dir():
    """build/ or build-demo/, the first with a coordinator binary (None: neither)."""
    for d in BUILD_DIRS:
        if os.access(os.path.join(d, "server", "coordinator", "coordinator"), os.X_OK):
            return d
    return None


# --- The daemons: running ones, or our own on this machine.
cluster = None
if args.local:
    try:
        cluster = LocalCluster(workers=2, build_dir=args.build_dir or default_build_dir(),
                               coordinator_binary=args.coordinator_binary,
                               worker_binary=args.worker_binary)
    except pipetrain.PipetrainError as e:
        sys.exit("cannot start the local cluster: %s\n(build the daemons with scripts/build.sh or "
                 "scripts/demo.sh, or point --build-dir at a build directory)" % e)
address = args.coordinator or cluster.address

# --- Data: the CLI's digits set and batch order (same batches as `pipetrain train --seed 1`).
digits = data.load("digits")
batches = data.batches(digits, batch_size=64, seed=1)

# --- Train: the job ends (FinishJob) when the block is left, or is cancelled on an error.
losses = []
try:
    with pipetrain.Client(address) as client:
        with client.create_job(model=os.path.join(HERE, "mlp_digits.textproto"),
                               schedule=args.schedule, stages=2, microbatches=4,
                               optimizer="adamw:lr=1e-2", seed=1, data=digits) as job:
            for result in job.train(batches, steps=args.steps):
                losses.append(result.loss)
                if result.step % 20 == 0 or result.step == args.steps:
                    print("step %d loss %.6f bubble %.3f" % (result.step, result.loss,
                                                             result.bubble_fraction))
finally:
    if cluster is not None:
        cluster.stop()

# --- Evaluate nothing here (see `pipetrain evaluate`); plot the curve.
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("matplotlib is not installed (apt-get install python3-matplotlib): no plot written")
    sys.exit(0)
fig, ax = plt.subplots(figsize=(6, 4))
ax.plot(np.arange(1, len(losses) + 1), losses)
ax.set_xlabel("step")
ax.set_ylabel("training loss")
ax.set_title("digits MLP, %s over 2 stages" % args.schedule)
fig.tight_layout()
fig.savefig(args.plot)
print("loss curve written to", args.plot)
