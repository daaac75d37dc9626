"""The Python client's recovery replay (Job, docs/python.md "Recovery") against real daemons on
127.0.0.1: a coordinator, 3 workers and a spare started here; the worker holding rank 1 is
SIGKILLed by its PID mid-run."""

import os
import signal
import threading
import time

import numpy as np
import pytest

import pipetrain
from pipetrain import StatusCode, data
from pipetrain.local import LocalCluster
from pipetrain.v1 import coordinator_pb2 as pb

STEPS = 60
CHECKPOINT_EVERY = 10
KILL_AFTER = 25
BATCH = 64
SEED = 1
OPTIMIZER = "adamw:lr=1e-2"


def bits(values):
    return np.asarray(values, dtype=np.float32).view(np.uint32).tolist()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(workers=4, log_dir=str(tmp_path_factory.mktemp("recovery"))) as c:
        yield c


def run(client, cluster, example, name, fault=None, on_wait=None):
    """Trains the digits MLP on 3 stages for STEPS steps, checkpointing every CHECKPOINT_EVERY
    under the coordinator's --checkpoint-root; calls fault(job) after step KILL_AFTER. Returns
    the StepResults, the Job and the events its on_recovery callback got."""
    digits = data.load("digits")
    events = []
    directory = os.path.join(cluster.checkpoint_root, name)
    results = []
    with client.create_job(model=example("mlp_digits.textproto"), schedule="1f1b", stages=3,
                           microbatches=4, optimizer=OPTIMIZER, seed=SEED, data=digits,
                           replace_timeout=20.0, on_recovery=events.append,
                           on_wait=on_wait) as job:
        for r in job.train(data.batches(digits, BATCH, seed=SEED), steps=STEPS, progress=False):
            results.append(r)
            if r.step % CHECKPOINT_EVERY == 0:
                assert job.checkpoint(directory).step == r.step
                assert job.kept_batches == 0
            if r.step == KILL_AFTER and fault is not None:
                assert job.kept_batches == KILL_AFTER - 20
                fault(job)
    return results, job, events


def test_a_lost_worker_is_replayed_through_bit_for_bit(cluster, example):
    with pipetrain.Client(cluster.address) as client:
        reference, _, _ = run(client, cluster, example, "reference")
        assert [r.step for r in reference] == list(range(1, STEPS + 1))
        assert all(not r.recoveries for r in reference)

        # The kill must land while a step is in flight: a batch sent after the coordinator
        # recovered the job between two steps would be applied at the restored step (the Job then
        # raises DATA_LOSS). So the worker is stopped first (no later step can finish without it),
        # and killed by a thread once the coordinator reports the step running.
        waits = []
        killed = {}

        def kill_during_the_next_step(job, pid):
            deadline = time.monotonic() + 30
            for _ in range(3000):  # bounded in count and time
                if job.status().state == pb.JOB_STATE_TRAINING or time.monotonic() > deadline:
                    break
                time.sleep(0.01)  # polling interval of a bounded wait
            killed["training"] = job.status().state == pb.JOB_STATE_TRAINING
            os.kill(pid, signal.SIGKILL)

        def stop_rank_1(job):
            holder = [w.name for w in client.workers() if w.job == job.id and w.rank == 1]
            assert len(holder) == 1
            killed["name"] = holder[0]
            pid = cluster.worker_pid(holder[0])
            os.kill(pid, signal.SIGSTOP)
            killer = threading.Thread(target=kill_during_the_next_step, args=(job, pid))
            killer.start()
            killed["thread"] = killer

        results, job, events = run(client, cluster, example, "faulted", fault=stop_rank_1,
                                   on_wait=waits.append)
        status = job.status()
        killed["thread"].join(timeout=30)
        assert not killed["thread"].is_alive() and killed["training"]
        assert cluster.wait_worker(killed["name"], timeout=10) == -signal.SIGKILL

    # The run completed, every step answered once, with the fault-free run's losses.
    assert [r.step for r in results] == list(range(1, STEPS + 1))
    assert bits([r.loss for r in results]) == bits([r.loss for r in reference])
    assert status.state == pb.JOB_STATE_DONE and status.steps_done == STEPS
    # One recovery, reported through the callback, job.recoveries and the step after the fault.
    assert len(events) == 1 and list(job.recoveries) == events
    event = events[0]
    assert event.cause == "lost" and event.lost_worker == killed["name"] and event.rank == 1
    assert event.restored_step == 20 and event.stages == 3 and len(event.workers) == 3
    assert killed["name"] not in event.workers and event.seconds >= 0
    # The failed step is the first the stopped worker did not finish: step 26, unless the batches
    # already sent when it was stopped (the running step and one read ahead) finished first — which
    # of the two happens first is the scheduler's choice, so any of the next few steps qualifies.
    recovered = [r.step for r in results if r.recoveries]
    assert len(recovered) == 1 and KILL_AFTER < recovered[0] < KILL_AFTER + 5
    assert results[recovered[0] - 1].recoveries == events
    assert list(status.recoveries) == events
    # One wait, begun by the failed step.
    assert [e.code for e in waits] == [StatusCode.ABORTED] and waits[0].method == "Train"


def test_without_recover_a_lost_worker_fails_the_step(cluster, example):
    digits = data.load("digits")
    with pipetrain.Client(cluster.address) as client:
        job = client.create_job(model=example("mlp_digits.textproto"), stages=3, microbatches=4,
                                optimizer=OPTIMIZER, seed=SEED, data=digits, recover=False)
        try:
            assert not job.spec.recover
            batches = data.batches(digits, BATCH, seed=SEED)
            inputs, targets = next(iter(batches))
            job.step(inputs, targets)
            assert job.kept_batches == 0  # nothing kept without recovery
        finally:
            job.cancel()


def test_bad_replay_options_are_refused_before_the_job_is_made(cluster, example):
    with pipetrain.Client(cluster.address) as client:
        for options in ({"max_kept_batches": 0}, {"recovery_timeout": 0},
                        {"replace_timeout": -1}, {"on_recovery": 3}):
            with pytest.raises(pipetrain.PipetrainError) as e:
                client.create_job(model=example("mlp_digits.textproto"), stages=3, **options)
            assert e.value.code == StatusCode.INVALID_ARGUMENT
        assert len([w for w in client.workers() if not w.job]) >= 3
