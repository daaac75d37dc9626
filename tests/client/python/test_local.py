"""pipetrain.local.LocalCluster's own options (the daemons it starts, not the client)."""

import os

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
