"""pipetrain.local.LocalCluster's own options (the daemons it starts, not the client)."""

import os
import shutil
import subprocess
import sys

import pytest

import pipetrain
from pipetrain import PipetrainError, StatusCode
from pipetrain.local import LocalCluster


def _cpus_allowed(pid):
    """The distinct Cpus_allowed_list values of every thread of process `pid`."""
    lists = set()
    for tid in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/status" % (pid, tid)) as f:
            for line in f:
                if line.startswith("Cpus_allowed_list:"):
                    lists.add(line.split()[1])
    return lists


def test_worker_cpus_run_each_worker_on_its_own(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs 2 CPUs, this process may use %d" % len(allowed))
    # One list as ints, one as a string: both spellings are accepted.
    with LocalCluster(workers=2, log_dir=str(tmp_path), worker_cpus=[[allowed[0]],
                                                                      str(allowed[1])]) as c:
        with pipetrain.Client(c.address) as client:
            assert sorted(w.cores for w in client.workers()) == [1, 1]
        assert _cpus_allowed(c.worker_pid("w0")) == {str(allowed[0])}
        assert _cpus_allowed(c.worker_pid("w1")) == {str(allowed[1])}


@pytest.mark.parametrize("worker_cpus", [["0"], ["0", ""], [["x"], ["0"]], 5])
def test_worker_cpus_need_one_list_per_worker(worker_cpus):
    with pytest.raises(PipetrainError) as e:
        LocalCluster(workers=2, worker_cpus=worker_cpus)
    assert e.value.code == StatusCode.INVALID_ARGUMENT
    assert "worker_cpus needs one non-empty CPU list per worker (2)" in e.value.message


def test_binaries_come_from_their_own_environment_variables(monkeypatch, tmp_path):
    # PIPETRAIN_COORDINATOR is the CLI's coordinator address: it names no binary here.
    monkeypatch.setenv("PIPETRAIN_COORDINATOR", "127.0.0.1:7070")
    with LocalCluster(workers=1, log_dir=str(tmp_path / "logs")) as c:
        with pipetrain.Client(c.address) as client:
            assert len(client.workers()) == 1
    monkeypatch.setenv("PIPETRAIN_COORDINATOR_BINARY", str(tmp_path / "nothing"))
    with pytest.raises(PipetrainError) as e:
        LocalCluster(workers=1)
    assert e.value.code == StatusCode.NOT_FOUND
    assert e.value.message == "$PIPETRAIN_COORDINATOR_BINARY (%s) is not an executable file" % (
        tmp_path / "nothing")


def _run_example(tmp_path, example, build_dir_name=None):
    """Runs a copy of examples/python_train.py --local from a repository-like tmp_path whose
    `build_dir_name` (if any) is the build tree, with no binary named by the environment."""
    (tmp_path / "examples").mkdir()
    for name in ("python_train.py", "mlp_digits.textproto"):
        shutil.copy(example(name), tmp_path / "examples")
    if build_dir_name:
        os.symlink(os.environ["PIPETRAIN_BUILD_DIR"], tmp_path / build_dir_name)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PIPETRAIN_COORDINATOR_BINARY", "PIPETRAIN_STAGE_WORKER_BINARY")}
    env["PATH"] = "/usr/bin:/bin"  # no stage_worker on it
    return subprocess.run([sys.executable, "examples/python_train.py", "--local", "--steps", "2",
                           "--plot", str(tmp_path / "loss.png")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_example_without_a_build_says_how_to_point_at_one(tmp_path, example):
    r = _run_example(tmp_path, example)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert "cannot start the local cluster: " in r.stderr
    assert "point --build-dir at a build directory" in r.stderr


def test_example_run_from_the_repository_root_finds_build_demo(tmp_path, example):
    r = _run_example(tmp_path, example, "build-demo")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "step 2 loss" in r.stdout


def test_stages_and_replicas_start_their_product_of_workers(tmp_path):
    with LocalCluster(stages=1, replicas=2, log_dir=str(tmp_path)) as c:
        with pipetrain.Client(c.address) as client:
            assert sorted(w.name for w in client.workers()) == ["w0", "w1"]


@pytest.mark.parametrize("kwargs, message", [
    ({"replicas": 2}, "replicas=2 needs stages= (the cluster starts stages x replicas workers)"),
    ({"stages": 2, "replicas": 0}, "replicas must be an integer >= 1, got 0"),
    ({"stages": 0}, "stages must be an integer >= 1, got 0"),
])
def test_a_shape_needs_positive_counts(kwargs, message):
    with pytest.raises(PipetrainError) as e:
        LocalCluster(**kwargs)
    assert e.value.code == StatusCode.INVALID_ARGUMENT
    assert e.value.message == message
