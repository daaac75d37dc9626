"""A scriptable fake of the coordinator's client API (pipetrain.v1.Coordinator: CreateJob, Train,
GetJob, Checkpoint, FinishJob, CancelJob) that plays one conformance scenario on 127.0.0.1 and
records what the client asked, in order, as text lines (the "calls" of a scenario's expectation).

The job: one job "job-1" whose batches are told apart by their sample count (the scenario's batch
number, "tag"); a step's loss is float32(1 / (tag + 1)), so a replayed batch gives the same loss
unless the scenario sets replay_loss_offset. The fake answers each request before it reads the
next one, so its record does not depend on timing.

A scenario's "coordinator" object:
  steps_done            the job's steps when it is created (default 0)
  invalid_batches       tags refused with INVALID_ARGUMENT (the job stays READY)
  replay_loss_offset    added to the loss of a step applied a second time
  ignore_expected_step  apply a batch whatever TrainRequest.expected_steps_done says (an old coordinator)
  faults                [{"at": {"step": S, "attempt": A} | {"checkpoint": N}, ACTION: {...}}]:
                        the A-th batch (default 1st) to arrive for step S, or the N-th Checkpoint
                        call, meets ACTION instead of being applied:
    recover         {"restore_to": R | "checkpoint", "polls": [...], "cause": "lost"}: the call ends
                    ABORTED, the job is RECOVERING at step R (default: its last checkpoint's, else
                    0) in a new generation, with a RecoveryEvent
    restart         {"restore_to": ..., "polls": [...]}: the coordinator restarts (its listening
                    socket and connections close; a new server takes the port), the job is
                    RECOVERING at step R with a "coordinator restart" RecoveryEvent
    cut             {"polls": [...]}: the call ends UNAVAILABLE; the job stays as it was
    apply_then_cut  {"polls": [...]}: (Train) the step is applied, then the stream ends UNAVAILABLE
    fail            {"code": CODE, "message": TEXT}: the call ends with that status, the job READY
    end             {}: (Train) the stream ends OK without an answer
    silent_restore  {"restore_to": R}: (Train) the job was restored to R between two steps and
                    applies the batch as step R + 1, answering it without an error
    grow            {}: (Train) the job grew from 2 to 3 stages before the batch, after a
                    checkpoint of the step before it (a recovery restores that one from then on):
                    the batch is applied and its result carries the ShapeChange, in a new
                    generation
  "polls" are GetJob's next answers, in order: READY, RECOVERING, FAILED (the job ended),
  UNAVAILABLE (a status the client does not retry: the coordinator unreachable), NOT_FOUND; a
  trailing "*" repeats the answer for ever. Afterwards GetJob answers the job's state (by default
  ["READY"]: ready at once).

CreateJob is recorded as "CreateJob recover=BOOL", with " save_to=DIR keep=K" when the spec
declares a save directory; Checkpoint as "Checkpoint keep=K", with " data=D batch=B cursor=E:N"
when the request carries a data position.

Train streams are named Train#1, Train#2, ... in the order of their first batch. As the real
coordinator, the first batch claims the job for the stream, and a claim while another stream holds
the job is refused (FAILED_PRECONDITION); the fake ends a stream it fails and a stream the client
closed (half-close) only after releasing the job. A stream the client cancels keeps its claim
until a claim has been refused because of it: the coordinator notices a cancel on its own time,
and the fake plays the order in which the next stream's claim arrives first.
"""

import collections
import threading
from concurrent import futures

import grpc
import numpy as np

from pipetrain.v1 import coordinator_pb2 as pb
from pipetrain.v1 import coordinator_pb2_grpc

JOB = "job-1"
_ENDED = (pb.JOB_STATE_DONE, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED)
# How long a stream whose requests ended is watched for a client cancel before the end counts as
# a half-close (a cancel is seen at once; a half-closed stream is alive until the fake answers).
_CANCEL_GRACE_S = 0.25
# How long a refused claim waits for the holding stream's end before it keeps the claim.
_HOLDER_END_WAIT_S = 5.0


class _Stream:
    """One Train stream as the fake sees it."""

    def __init__(self, context):
        self.context = context
        self.id = None  # its number, from its first batch.
        self.ended = threading.Event()  # the RPC is over (answered, failed or cancelled).
        context.add_callback(self.ended.set)

    def name(self):
        return "Train#%d" % self.id


class _Abort(Exception):
    """Ends the current call with `code` and `message`."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


class FakeCoordinator(coordinator_pb2_grpc.CoordinatorServicer):
    """Plays `scenario` (a dict, the JSON file's content). start() serves it; record() is what
    the client asked. Thread-safe (gRPC's threads call it)."""

    def __init__(self, scenario):
        config = scenario.get("coordinator", {})
        self._lock = threading.Lock()
        self._record = []
        self._state = pb.JOB_STATE_READY
        self._reason = ""
        self._steps_done = int(config.get("steps_done", 0))
        self._generation = 1
        self._checkpoint_step = None
        self._recoveries = []
        self._recover = False
        self._attempts = collections.Counter()  # step -> batches that arrived for it
        self._checkpoints = 0
        self._applied_max = self._steps_done
        self._faults = [dict(f) for f in config.get("faults", [])]
        self._polls = collections.deque()
        self._invalid = set(config.get("invalid_batches", []))
        self._replay_loss_offset = float(config.get("replay_loss_offset", 0.0))
        self._ignore_expected_step = bool(config.get("ignore_expected_step", False))
        self._holder = None  # the _Stream that holds the job
        self._streams = 0
        self._server = None
        self.port = None

    # ------------------------------------------------------------------ serving

    def start(self):
        """Serves on 127.0.0.1 (a free port); returns "127.0.0.1:PORT"."""
        self._server, self.port = self._serve(0)
        return "127.0.0.1:%d" % self.port

    def stop(self):
        self._server.stop(None).wait()

    def record(self):
        with self._lock:
            return list(self._record)

    def _serve(self, port):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        coordinator_pb2_grpc.add_CoordinatorServicer_to_server(self, server)
        bound = server.add_insecure_port("127.0.0.1:%d" % port)
        if bound == 0 or (port and bound != port):
            raise RuntimeError("the fake coordinator cannot listen on 127.0.0.1:%d" % port)
        server.start()
        return server, bound

    def _restart(self):
        """A coordinator restart: a new server takes the port (SO_REUSEPORT) before the old one
        stops, so the client's next connection finds it; every call on the old one ends."""
        new, _ = self._serve(self.port)
        old, self._server = self._server, new
        old.stop(None)

    # ------------------------------------------------------------------ the job

    def _status(self):
        status = pb.JobStatus(job=JOB, state=self._state, generation=self._generation,
                              steps_done=self._steps_done, reason=self._reason)
        status.spec.recover = self._recover
        status.recoveries.extend(self._recoveries)
        return status

    def _log(self, line):
        self._record.append(line)

    def _fault(self, key, value, attempt=1):
        for fault in self._faults:
            at = fault["at"]
            if not fault.get("fired") and at.get(key) == value and at.get("attempt", 1) == attempt:
                fault["fired"] = True
                return fault
        return None

    def _restore_target(self, action):
        target = action.get("restore_to", "checkpoint")
        if target == "checkpoint":
            return self._checkpoint_step or 0
        return int(target)

    def _begin_recovery(self, action, cause):
        before = self._steps_done
        self._steps_done = self._restore_target(action)
        self._state = pb.JOB_STATE_RECOVERING
        self._generation += 1
        restart = cause == "coordinator restart"
        self._recoveries.append(pb.RecoveryEvent(
            lost_worker="" if restart else "w1", rank=-1 if restart else 1,
            steps_done=self._steps_done if restart else before,
            restored_step=self._steps_done, workers=["w0", "w2"], generation=self._generation, seconds=0.5,
            cause=cause, stages=2))

    def _set_polls(self, action):
        self._polls = collections.deque(action.get("polls", ["READY"]))

    def _act(self, fault, what):
        """Plays `fault` on the call `what` (a record prefix); returns the record's outcome and
        raises _Abort, or returns ("restart",)/("end",)/("result", StepResult)."""
        if "recover" in fault:
            action = fault["recover"]
            self._begin_recovery(action, action.get("cause", "lost"))
            self._set_polls(action)
            self._log("%s -> ABORTED (recovering from step %d)" % (what, self._steps_done))
            raise _Abort(grpc.StatusCode.ABORTED,
                         "job %s is recovering from a lost worker (restored to step %d)"
                         % (JOB, self._steps_done))
        if "restart" in fault:
            action = fault["restart"]
            self._begin_recovery(action, "coordinator restart")
            self._set_polls(action)
            self._holder = None  # the restarted coordinator knows no stream
            self._log("%s -> (the coordinator restarts)" % what)
            return ("restart",)
        if "cut" in fault:
            self._set_polls(fault["cut"])
            self._log("%s -> UNAVAILABLE (cut)" % what)
            raise _Abort(grpc.StatusCode.UNAVAILABLE, "Connection reset by peer")
        if "fail" in fault:
            action = fault["fail"]
            self._log("%s -> %s" % (what, action["code"]))
            raise _Abort(getattr(grpc.StatusCode, action["code"]), action.get("message", "failed"))
        raise ValueError("fault %r does not apply to %s" % (fault, what))

    # ------------------------------------------------------------------ unary calls

    def CreateJob(self, request, context):
        with self._lock:
            self._recover = request.spec.recover
            line = "CreateJob recover=%s" % str(self._recover).lower()
            if request.spec.save_to:
                line += " save_to=%s keep=%d" % (request.spec.save_to,
                                                 request.spec.keep_checkpoints)
            self._log(line)
            return self._status()

    def GetJob(self, request, context):
        with self._lock:
            answer = None
            if self._polls:
                answer = self._polls[0]
                if answer.endswith("*"):
                    answer = answer[:-1]
                else:
                    self._polls.popleft()
            if answer == "UNAVAILABLE":
                self._log("GetJob -> UNAVAILABLE")
                # Not retried by the client's retry policy: one poll, one answer.
                context.set_trailing_metadata((("grpc-retry-pushback-ms", "-1"),))
                context.abort(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
            if answer == "NOT_FOUND":
                self._log("GetJob -> NOT_FOUND")
                context.abort(grpc.StatusCode.NOT_FOUND, "job '%s' is not known" % JOB)
            if answer == "READY":
                self._state = pb.JOB_STATE_READY
            elif answer == "RECOVERING":
                self._state = pb.JOB_STATE_RECOVERING
            elif answer == "FAILED":
                self._state = pb.JOB_STATE_FAILED
                self._reason = "worker w1 was lost and no worker replaced it within 30s"
            elif answer is not None:
                raise ValueError("unknown GetJob answer %r" % answer)
            line = "GetJob -> %s" % pb.JobState.Name(self._state).replace("JOB_STATE_", "")
            if self._state == pb.JOB_STATE_READY:
                line += " at %d" % self._steps_done
            self._log(line)
            return self._status()

    def Checkpoint(self, request, context):
        restart = False
        with self._lock:
            self._checkpoints += 1
            what = "Checkpoint keep=%d" % request.keep
            if request.HasField("data_position"):
                p = request.data_position
                what += " data=%s batch=%d cursor=%d:%d" % (p.data, p.batch_size, p.cursor_epoch,
                                                            p.cursor_batch)
            fault = self._fault("checkpoint", self._checkpoints)
            try:
                if fault is not None:
                    restart = self._act(fault, what) == ("restart",)
                else:
                    self._checkpoint_step = self._steps_done
                    self._log("%s -> step %d" % (what, self._steps_done))
                    return pb.CheckpointResponse(step=self._steps_done, directory=request.directory)
            except _Abort as e:
                abort = e
        if restart:
            self._restart_and_wait(context)
            return pb.CheckpointResponse()
        context.abort(abort.code, abort.message)

    def FinishJob(self, request, context):
        with self._lock:
            self._state = pb.JOB_STATE_DONE
            self._log("FinishJob -> DONE")
            return self._status()

    def CancelJob(self, request, context):
        with self._lock:
            self._state = pb.JOB_STATE_CANCELLED
            self._log("CancelJob -> CANCELLED")
            return self._status()

    def _restart_and_wait(self, context):
        """Restarts the coordinator from another thread (stopping a server from one of its
        handlers could wait for that handler) and waits for this call to be ended by it."""
        ended = threading.Event()
        context.add_callback(ended.set)
        threading.Thread(target=self._restart, daemon=True).start()
        ended.wait(_HOLDER_END_WAIT_S)

    # ------------------------------------------------------------------ Train

    def Train(self, request_iterator, context):
        stream = _Stream(context)
        for request in request_iterator:
            try:
                with self._lock:
                    outcome = self._train(stream, request)
                if outcome[0] == "conflict":
                    outcome = self._refuse_claim(stream, outcome[1])
            except _Abort as e:
                context.abort(e.code, e.message)
            if outcome[0] == "result":
                yield outcome[1]
            elif outcome[0] == "restart":
                self._restart_and_wait(context)
                return
            elif outcome[0] == "end":
                return
        # The requests ended: a half-close (the client waits for this stream's end) or a cancel.
        if stream.ended.wait(_CANCEL_GRACE_S) or not context.is_active():
            return  # cancelled: the claim stays until a claim is refused because of it.
        with self._lock:
            if stream.id is not None:
                self._log("%s closed by the client" % stream.name())
            self._release(stream)

    def _release(self, stream):
        if self._holder is stream:
            self._holder = None

    def _refuse_claim(self, stream, holder):
        """Refuses `stream`'s claim of the job that `holder` holds; once the holder has ended
        (a cancelled stream), the job is released for the next claim."""
        holder_ended = holder.ended.wait(_HOLDER_END_WAIT_S)
        with self._lock:
            self._log("%s -> FAILED_PRECONDITION (job held by %s)" % (stream.name(), holder.name()))
            if holder_ended:
                self._release(holder)
        raise _Abort(grpc.StatusCode.FAILED_PRECONDITION,
                     "job '%s' already has an active Train stream; only one client may train a "
                     "job at a time" % JOB)

    def _train(self, stream, request):
        """One batch of `stream`: ("result", StepResult), ("restart",), ("end",) or
        ("conflict", holder); raises _Abort to end the stream."""
        if stream.id is None:
            self._streams += 1
            stream.id = self._streams
            if self._holder is not None and self._holder is not stream:
                return ("conflict", self._holder)
            self._holder = stream
        tag = request.samples
        expected = request.expected_steps_done if request.HasField("expected_steps_done") else None
        what = "%s batch %d @%s" % (stream.name(), tag, "-" if expected is None else expected)
        try:
            return self._apply(stream, request, tag, expected, what)
        except _Abort:
            self._release(stream)  # before the client sees the status, as the coordinator does
            raise

    def _apply(self, stream, request, tag, expected, what):
        if self._state == pb.JOB_STATE_RECOVERING:
            self._log("%s -> ABORTED (recovering)" % what)
            raise _Abort(grpc.StatusCode.ABORTED, "job %s is recovering" % JOB)
        if self._state in _ENDED:
            self._log("%s -> FAILED_PRECONDITION (ended)" % what)
            raise _Abort(grpc.StatusCode.FAILED_PRECONDITION, "job %s has ended" % JOB)
        if expected is not None and expected != self._steps_done and not self._ignore_expected_step:
            behind = expected > self._steps_done
            code = grpc.StatusCode.ABORTED if behind else grpc.StatusCode.FAILED_PRECONDITION
            self._log("%s -> %s (at step %d)" % (what, code.name, self._steps_done))
            raise _Abort(code, "job '%s' has done %d steps; this batch is for step %d"
                         % (JOB, self._steps_done, expected + 1))
        if tag in self._invalid:
            self._log("%s -> INVALID_ARGUMENT" % what)
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT,
                         "batch %d: inputs have 1 feature, the model takes 2" % tag)
        step = self._steps_done + 1
        self._attempts[step] += 1
        fault = self._fault("step", step, self._attempts[step])
        if fault is not None:
            if "end" in fault:
                self._log("%s -> ended OK without an answer" % what)
                self._release(stream)
                return ("end",)
            if "apply_then_cut" in fault:
                self._steps_done = step
                self._applied_max = max(self._applied_max, step)
                self._set_polls(fault["apply_then_cut"])
                self._log("%s -> applied as step %d, then UNAVAILABLE (cut)" % (what, step))
                raise _Abort(grpc.StatusCode.UNAVAILABLE, "Connection reset by peer")
            if "grow" in fault:
                self._checkpoint_step = self._steps_done
                self._generation += 1
                self._log("%s -> step %d (grew from 2 to 3 stages after step %d)"
                          % (what, step, self._steps_done))
                outcome = self._result(step, tag)
                outcome[1].shape_change.CopyFrom(pb.ShapeChange(
                    step=step - 1, stages_before=2, stages=3, replicas_before=1, replicas=1,
                    joined=["w2"], workers=["w0", "w1", "w2"], generation=self._generation,
                    seconds=0.25, checkpoint="/growth/" + JOB))
                return outcome
            if "silent_restore" in fault:
                self._begin_recovery(fault["silent_restore"], "lost")
                self._state = pb.JOB_STATE_READY
                step = self._steps_done + 1
                self._log("%s -> step %d (restored to step %d between two steps)"
                          % (what, step, self._steps_done))
                return self._result(step, tag)
            return self._act(fault, what)
        self._log("%s -> step %d" % (what, step))
        return self._result(step, tag)

    def _result(self, step, tag):
        loss = np.float32(1.0 / (tag + 1))
        if step <= self._applied_max:
            loss = np.float32(loss + np.float32(self._replay_loss_offset))
        self._steps_done = step
        self._applied_max = max(self._applied_max, step)
        return ("result", pb.StepResult(step=step, loss=float(loss),
                                        microbatch_losses=[float(loss)]))
