"""The Job's replay logic (docs/python.md "Recovery") against a scripted in-process coordinator
on 127.0.0.1: which batches are resent, in what order, and the errors of a recovery that cannot
be exact (DATA_LOSS) or cannot reach back far enough (FAILED_PRECONDITION)."""

import threading
from concurrent import futures

import grpc
import numpy as np
import pytest

import pipetrain
from pipetrain import StatusCode
from pipetrain.v1 import coordinator_pb2 as pb
from pipetrain.v1 import coordinator_pb2_grpc

MODEL = "layers { linear { in_features: 1 out_features: 1 } } loss { mse {} }"


class _ScriptedCoordinator(coordinator_pb2_grpc.CoordinatorServicer):
    """A job whose step N has loss 1/N. At the step `fail_at` (once) the Train stream ends ABORTED
    and the job restarts at `restore_to` (READY at once). `replay_loss_offset` is added to the
    losses of steps answered after the failure that were answered before (a bad replay). Each
    request carries its batch's number in `samples`. silent: at `fail_at` the job restarts
    without ending the stream and applies the batch at the restored step (as the coordinator does
    when it recovered a job between two steps); `sent` lists them in the order received."""

    def __init__(self, fail_at, restore_to, replay_loss_offset=0.0, silent=False):
        self.silent = silent
        self.fail_at = fail_at
        self.restore_to = restore_to
        self.replay_loss_offset = replay_loss_offset
        self.recover = None
        self.steps_done = 0
        self.answered = 0
        self.failed = False
        self.sent = []
        self.lock = threading.Lock()

    def _status(self):
        status = pb.JobStatus(job="j1", state=pb.JOB_STATE_READY, steps_done=self.steps_done)
        status.spec.recover = self.recover
        if self.failed:
            status.recoveries.add(lost_worker="w1", rank=1, cause="lost",
                                  steps_done=self.fail_at - 1, restored_step=self.restore_to,
                                  stages=2, workers=["w0", "w2"])
        return status

    def CreateJob(self, request, context):
        self.recover = request.spec.recover
        return self._status()

    def GetJob(self, request, context):
        with self.lock:
            return self._status()

    def Checkpoint(self, request, context):
        with self.lock:
            return pb.CheckpointResponse(step=self.steps_done, directory=request.directory)

    def CancelJob(self, request, context):
        return self._status()

    def FinishJob(self, request, context):
        return self._status()

    def Train(self, request_iterator, context):
        for request in request_iterator:
            with self.lock:
                self.sent.append(request.samples)
                step = self.steps_done + 1
                if step == self.fail_at and not self.failed and self.silent:
                    self.failed = True  # restarted between two steps; this batch is applied
                    step = self.steps_done = self.restore_to + 1
                    fail, loss = False, np.float32(1.0 / step)
                elif step == self.fail_at and not self.failed:
                    self.failed = True
                    self.steps_done = self.restore_to
                    fail = True
                else:
                    fail = False
                    self.steps_done = step
                    loss = np.float32(1.0 / step)
                    if step <= self.answered:
                        loss = np.float32(loss + self.replay_loss_offset)
                    self.answered = max(self.answered, step)
            if fail:
                context.abort(grpc.StatusCode.ABORTED, "job j1 is recovering from a lost worker")
            yield pb.StepResult(step=step, loss=float(loss))


@pytest.fixture
def scripted():
    """Starts a _ScriptedCoordinator made by the test's factory call on 127.0.0.1; yields the
    factory, which returns (servicer, connected Client)."""
    started = []

    def start(**kwargs):
        servicer = _ScriptedCoordinator(**kwargs)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        coordinator_pb2_grpc.add_CoordinatorServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        client = pipetrain.Client("127.0.0.1:%d" % port, connect_timeout=5)
        started.append((server, client))
        return servicer, client

    yield start
    for server, client in started:
        client.close()
        server.stop(None)


def train(job, steps, checkpoint_at=()):
    """Steps 1..steps with batch n tagged samples=n; checkpoints after the steps in checkpoint_at.
    Returns the StepResults."""
    results = []
    for n in range(1, steps + 1):
        results.append(job.step(np.zeros((n, 1)), np.zeros((n, 1))))
        if n in checkpoint_at:
            job.checkpoint("/ckpt")
    return results


def test_replays_the_batches_since_the_checkpoint_then_the_failed_one(scripted):
    servicer, client = scripted(fail_at=5, restore_to=2)
    events = []
    job = client.create_job(model=MODEL, on_recovery=events.append)
    results = train(job, 6, checkpoint_at=(2,))
    assert servicer.recover
    # Batches 3 and 4 resent after the failed 5th, then the 5th again; every step answered once.
    assert servicer.sent == [1, 2, 3, 4, 5, 3, 4, 5, 6]
    assert [r.step for r in results] == [1, 2, 3, 4, 5, 6]
    assert [r.loss for r in results] == [float(np.float32(1.0 / n)) for n in range(1, 7)]
    assert len(events) == 1 and events[0].restored_step == 2 and events[0].cause == "lost"
    assert job.recoveries == events
    assert [r.recoveries for r in results] == [[], [], [], [], events, []]
    assert job.kept_batches == 4  # steps 3..6: the checkpoint at 2 dropped 1 and 2


def test_a_replayed_loss_that_differs_is_data_loss(scripted):
    servicer, client = scripted(fail_at=4, restore_to=1, replay_loss_offset=1e-7)
    job = client.create_job(model=MODEL)
    with pytest.raises(pipetrain.PipetrainError) as e:
        train(job, 4)
    assert e.value.code == StatusCode.DATA_LOSS
    assert "replaying step 2 of job j1" in e.value.message and "not exact" in e.value.message
    assert servicer.sent == [1, 2, 3, 4, 2]


def test_a_restart_before_the_kept_batches_is_failed_precondition(scripted):
    servicer, client = scripted(fail_at=5, restore_to=1)
    job = client.create_job(model=MODEL)
    with pytest.raises(pipetrain.PipetrainError) as e:
        train(job, 5, checkpoint_at=(3,))  # kept: steps 4.. only
    assert e.value.code == StatusCode.FAILED_PRECONDITION
    assert "restarted at step 1 but this Job can replay only steps 3 to 4" in e.value.message
    assert servicer.sent == [1, 2, 3, 4, 5]


def test_without_recover_the_aborted_step_raises_and_nothing_is_kept(scripted):
    servicer, client = scripted(fail_at=3, restore_to=0)
    job = client.create_job(model=MODEL, recover=False)
    with pytest.raises(pipetrain.PipetrainError) as e:
        train(job, 3)
    assert e.value.code == StatusCode.ABORTED and e.value.method == "Train"
    assert job.kept_batches == 0 and job.recoveries == []
    assert servicer.sent == [1, 2, 3] and not servicer.recover


def test_a_batch_applied_at_a_restored_step_without_an_error_is_data_loss(scripted):
    servicer, client = scripted(fail_at=5, restore_to=2, silent=True)
    job = client.create_job(model=MODEL)
    with pytest.raises(pipetrain.PipetrainError) as e:
        train(job, 5, checkpoint_at=(2,))
    assert e.value.code == StatusCode.DATA_LOSS
    assert "applied this batch as step 3, expected step 5" in e.value.message
    assert servicer.sent == [1, 2, 3, 4, 5]


def test_send_ahead_replays_the_kept_batches_then_resends_the_unanswered_ones(scripted):
    servicer, client = scripted(fail_at=5, restore_to=2)
    events = []
    job = client.create_job(model=MODEL, on_recovery=events.append)
    results = train(job, 2, checkpoint_at=(2,))
    # Batches 3..6 with two in flight; the stream fails at the 5th with the 6th behind it.
    def send(n):
        job.send(np.zeros((n, 1)), np.zeros((n, 1)))

    send(3)
    send(4)
    for n in range(3, 7):
        results.append(job.receive())
        if n + 2 <= 6:
            send(n + 2)
    # 3 and 4 replayed after the failed 5th, then 5 and 6 resent; every step answered once.
    assert servicer.sent == [1, 2, 3, 4, 5, 3, 4, 5, 6]
    assert [r.step for r in results] == [1, 2, 3, 4, 5, 6]
    assert [r.loss for r in results] == [float(np.float32(1.0 / n)) for n in range(1, 7)]
    assert len(events) == 1 and events[0].restored_step == 2
    assert [r.recoveries for r in results] == [[], [], [], [], events, []]
    assert job.kept_batches == 4 and job.in_flight == 0


def test_send_receive_misuse_is_failed_precondition(scripted):
    servicer, client = scripted(fail_at=100, restore_to=0)
    job = client.create_job(model=MODEL)
    with pytest.raises(pipetrain.PipetrainError) as e:
        job.receive()
    assert e.value.code == StatusCode.FAILED_PRECONDITION
    job.send(np.zeros((1, 1)), np.zeros((1, 1)))
    for call, words in ((lambda: job.step(np.zeros((2, 1)), np.zeros((2, 1))), "receive() first"),
                        (lambda: job.checkpoint("/ckpt"), "receive() first")):
        with pytest.raises(pipetrain.PipetrainError) as e:
            call()
        assert e.value.code == StatusCode.FAILED_PRECONDITION and words in e.value.message
    job.send(np.zeros((2, 1)), np.zeros((2, 1)))
    with pytest.raises(pipetrain.PipetrainError) as e:
        job.send(np.zeros((3, 1)), np.zeros((3, 1)))
    assert e.value.code == StatusCode.FAILED_PRECONDITION
    assert [job.receive().step, job.receive().step] == [1, 2]
    assert job.checkpoint("/ckpt").step == 2
    assert servicer.sent == [1, 2]
