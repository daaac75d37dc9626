"""The coordinator's client API in Python, in the style of the C++ SDK (client/sdk/client.h).

    with pipetrain.Client("127.0.0.1:7070") as client:
        with client.create_job(model="examples/mlp_digits.textproto", schedule="1f1b", stages=2,
                               microbatches=4, optimizer="adamw:lr=1e-2", seed=1) as job:
            for result in job.train(batches):   # (inputs, targets) pairs: numpy or torch
                print(result.step, result.loss)
        # leaving the block finishes the job (FinishJob), or cancels it on an exception

Errors are PipetrainError (pipetrain.errors) carrying the gRPC status code and message. Not
thread-safe: one thread drives a Job; a Client may be shared by several Jobs of one thread.
"""

import collections
import dataclasses
import fractions
import itertools
import json
import os
import queue
import re
import sys
import time

import grpc
import numpy as np
from google.protobuf import text_format

from pipetrain.errors import PipetrainError, StatusCode
from pipetrain.v1 import coordinator_pb2 as pb
from pipetrain.v1 import coordinator_pb2_grpc
from pipetrain.v1 import model_pb2
from pipetrain.v1 import tensor_pb2

# The environment variable a token is taken from when Client(token=None).
TOKEN_ENV = "PIPETRAIN_TOKEN"
# The metadata key the coordinator reads the token from ("Bearer <token>").
TOKEN_METADATA_KEY = "authorization"


@dataclasses.dataclass
class StepResult:
    """One applied training step (coordinator.proto StepResult).

    step: 1-based number of the step applied. loss: the batch's mean loss (a float32 value, held
    exactly by the Python float). microbatch_losses: by micro-batch. step_ms: wall time at the
    coordinator. bubble_fraction: measured idle fraction of the pipeline; predicted_bubble_fraction:
    the simulator's for the measured action costs. workers: per-rank WorkerTimeline messages
    (busy_ms, bubble_fraction, action timings). proto: the message itself. recoveries: the
    coordinator's RecoveryEvent messages of the recoveries this step waited and replayed through
    before it was applied (usually empty; see Job.recoveries). shape_change: the coordinator's
    ShapeChange when the job changed shape (grew onto idle workers, or a growth failed) just
    before this step, else None (see Job.shape_changes)."""

    step: int
    loss: float
    microbatch_losses: list
    step_ms: float
    bubble_fraction: float
    predicted_bubble_fraction: float
    workers: list
    proto: pb.StepResult
    recoveries: list = dataclasses.field(default_factory=list)
    shape_change: object = None

    @classmethod
    def from_proto(cls, r, recoveries=()):
        return cls(r.step, r.loss, list(r.microbatch_losses), r.step_ms, r.bubble_fraction,
                   r.predicted_bubble_fraction, list(r.workers), r, list(recoveries),
                   r.shape_change if r.HasField("shape_change") else None)


def _invalid(message):
    return PipetrainError(StatusCode.INVALID_ARGUMENT, message)


def _read_model_file(path):
    """The text of the model file `path`. NOT_FOUND if it does not exist (naming the directory a
    relative path is read from), INVALID_ARGUMENT if it is not a readable regular file."""
    path = os.fspath(path)
    if not os.path.exists(path):
        where = "" if os.path.isabs(path) else " (relative to the current directory %s)" % os.getcwd()
        raise PipetrainError(StatusCode.NOT_FOUND,
                             "model file %s does not exist%s: pass the path of a ModelSpec text "
                             "file (e.g. examples/mlp_digits.textproto), its text or a ModelSpec"
                             % (path, where))
    if not os.path.isfile(path):
        raise _invalid("model file %s is not a regular file" % path)
    try:
        with open(path, "r", encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise _invalid("cannot read model file %s: %s" % (path, e)) from None


def model_spec(model):
    """A ModelSpec from a ModelSpec message, a path to a protobuf text file (examples/*.textproto)
    or the text itself. A string that names no file is text when it has a message block ("{" or
    "<", as every model's `layers` has) or a newline, else a path: NOT_FOUND saying the file is
    missing. INVALID_ARGUMENT naming the source on a syntax error."""
    if isinstance(model, model_pb2.ModelSpec):
        return model
    if isinstance(model, os.PathLike) or (
            isinstance(model, str) and (os.path.isfile(model) or not re.search(r"[{<\n]", model))):
        text, source = _read_model_file(model), os.fspath(model)
    elif isinstance(model, str):
        text, source = model, "model text"
    else:
        raise _invalid("model must be a ModelSpec, a file path or its text, got %s"
                       % type(model).__name__)
    try:
        return text_format.Parse(text, model_pb2.ModelSpec())
    except text_format.ParseError as e:
        raise _invalid("invalid model spec: %s:%s" % (source, e)) from None


_SGD_KEYS = {"lr", "momentum", "weight_decay", "nesterov"}
_ADAMW_KEYS = {"lr", "beta1", "beta2", "eps", "weight_decay"}
# The --optimizer text's schedule keys (math::ParseOptimizerConfig) -> lr_schedule_spec() keys.
_OPTIMIZER_SCHEDULE_KEYS = {"lr_schedule": "kind", "warmup_steps": "warmup_steps",
                            "decay_steps": "decay_steps", "lr_min": "min_lr"}
_LR_SCHEDULE_KINDS = {"constant": model_pb2.LrScheduleSpec.CONSTANT,
                      "warmup-cosine": model_pb2.LrScheduleSpec.WARMUP_COSINE,
                      "warmup-linear": model_pb2.LrScheduleSpec.WARMUP_LINEAR}
_LR_SCHEDULE_NAMES = {v: k for k, v in _LR_SCHEDULE_KINDS.items()}
# lr_schedule_spec() keys; the CLI's flag names (--lr-decay-steps, --lr-min) are accepted too.
_LR_SCHEDULE_ALIASES = {"lr_decay_steps": "decay_steps", "lr_min": "min_lr"}

# The numbers of the optimizer's text, as the C++ parser reads them (absl::SimpleAtof and
# SimpleAtoi, around whitespace stripped): decimal, an optional sign, no digit separators.
_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\Z")
_SPECIAL = re.compile(r"[+-]?(inf|infinity|nan)\Z", re.IGNORECASE)
_INTEGER = re.compile(r"[+-]?\d+\Z")
_FLOAT32_MAX_EXPONENT = 128  # 2**128: the first power of two past the largest float32.


def _float32_of_decimal(text):
    """The float32 nearest to the decimal number `text` (ties to even), rounded once as C++'s
    strtof does; a float() would round to double first, and the float32 of that double differs
    for some texts (e.g. "1.00000005960464477539062501": 1.0 instead of 1.0000001)."""
    negative = text.startswith("-")
    approximate = abs(float(text))  # fast for any exponent; decides the far ends
    if approximate > 1e39:  # beyond 2**128: infinite as a float32
        return float("-inf") if negative else float("inf")
    if approximate < 1e-47:  # below half of the smallest subnormal (2**-150): zero
        return -0.0 if negative else 0.0
    exact = fractions.Fraction(text)
    magnitude = abs(exact)
    # 2**e <= magnitude < 2**(e + 1)
    e = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if fractions.Fraction(2) ** e > magnitude:
        e -= 1
    quantum = max(e - 23, -149)  # 24 significant bits; subnormals below 2**-126
    units = round(magnitude / fractions.Fraction(2) ** quantum)  # Fraction rounds half to even
    value = units * fractions.Fraction(2) ** quantum
    result = float("inf") if value >= fractions.Fraction(2) ** _FLOAT32_MAX_EXPONENT \
        else float(value)
    return -result if negative else result


def _number(value, what):
    """`value` (a number, or text as the optimizer's) as the float32 the C++ client would use;
    INVALID_ARGUMENT naming `what` otherwise. Non-finite values pass: the range checks (here or
    the coordinator's) refuse them."""
    if isinstance(value, str):
        text = value.strip()
        if _DECIMAL.match(text):
            return _float32_of_decimal(text)
        if _SPECIAL.match(text):
            return float(np.float32(float(text)))
        raise _invalid("%s must be a decimal number, got %r" % (what, value))
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise _invalid("%s must be a decimal number, got %r" % (what, value))
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def _integer(value, what):
    """`value` (an int, a float without a fraction, or decimal digits) as an int64; INVALID_ARGUMENT
    naming `what` otherwise."""
    if isinstance(value, str):
        text = value.strip()
        if not _INTEGER.match(text):
            raise _invalid("%s must be an integer, got %r" % (what, value))
        number = int(text)
    elif isinstance(value, (bool, np.bool_)):
        raise _invalid("%s must be an integer, got %r" % (what, value))
    elif isinstance(value, (int, np.integer)):
        number = int(value)
    elif isinstance(value, (float, np.floating)) and float(value).is_integer():
        number = int(value)
    else:
        raise _invalid("%s must be an integer, got %r" % (what, value))
    if not -2 ** 63 <= number < 2 ** 63:
        raise _invalid("%s must be an integer, got %r" % (what, value))
    return number


def _parse_kind_and_keys(text, what):
    """("kind", {"key": "value", ...}) from "kind:key=value,..." (`what` names it in errors), read
    as the C++ parser reads it: whitespace around the kind, a key or a value ignored, every item
    exactly one key=value, each key at most once."""
    kind, _, args = text.partition(":")
    values = {}
    if args.strip():
        for item in args.split(","):
            parts = item.split("=")
            if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
                raise _invalid("%s %r: expected key=value, got %r" % (what, text, item))
            key = parts[0].strip()
            if key in values:
                raise _invalid("%s %r: key %r is given twice" % (what, text, key))
            values[key] = parts[1].strip()
    return kind.strip(), values


def _lr_schedule_fields(schedule):
    """The LrScheduleSpec fields `schedule` gives (see lr_schedule_spec()), by field name: the
    ones it names, or all of them for a message."""
    if isinstance(schedule, model_pb2.LrScheduleSpec):
        return {"kind": schedule.kind, "warmup_steps": schedule.warmup_steps,
                "decay_steps": schedule.decay_steps, "min_lr": schedule.min_lr}
    if isinstance(schedule, str):
        kind, values = _parse_kind_and_keys(schedule, "lr_schedule")
        if kind:
            values["kind"] = kind
    elif isinstance(schedule, dict):
        values = dict(schedule)
    else:
        raise _invalid("lr_schedule must be an LrScheduleSpec, text or a dict, got %s"
                       % type(schedule).__name__)
    fields = {}
    for key, value in values.items():
        field = _LR_SCHEDULE_ALIASES.get(key, key)
        if field == "kind":
            name = str(value).strip().replace("_", "-")
            if name not in _LR_SCHEDULE_KINDS:
                raise _invalid("lr_schedule: unknown kind %r (expected constant, warmup-cosine or "
                               "warmup-linear)" % (value,))
            fields["kind"] = _LR_SCHEDULE_KINDS[name]
        elif field == "min_lr":
            fields["min_lr"] = _number(value, "lr_schedule: %s" % key)
        elif field in ("warmup_steps", "decay_steps"):
            fields[field] = _integer(value, "lr_schedule: %s" % key)
        else:
            raise _invalid("lr_schedule: unknown key %r (expected kind, warmup_steps, "
                           "decay_steps, min_lr)" % (key,))
    return fields


def _lr_schedule_message(fields):
    """The LrScheduleSpec of `fields`; INVALID_ARGUMENT for a decaying kind without decay_steps."""
    spec = model_pb2.LrScheduleSpec(**fields)
    if spec.kind != model_pb2.LrScheduleSpec.CONSTANT and spec.decay_steps == 0:
        raise _invalid("lr_schedule %s: decay_steps is required (the update at which the rate "
                       "reaches min_lr; `pipetrain` defaults it to --steps)"
                       % _LR_SCHEDULE_NAMES[spec.kind])
    return spec


def lr_schedule_spec(schedule):
    """An LrScheduleSpec (docs/training.md, "Learning-rate schedules") from a message, a dict
    {"kind": "warmup-cosine", "warmup_steps": 10, "decay_steps": 100, "min_lr": 1e-4} or text in
    the optimizer's style ("warmup-cosine:warmup_steps=10,decay_steps=100,min_lr=1e-4"). kind:
    constant | warmup-cosine | warmup-linear (default constant); warmup_steps >= 0 (default 0);
    decay_steps (also lr_decay_steps, as `pipetrain --lr-decay-steps`): the update at which a
    decaying kind reaches min_lr (also lr_min), required for them since the client does not know
    how many steps the job will make (the CLI's default is --steps). INVALID_ARGUMENT for an
    unknown kind or key, a value of the wrong type or a missing decay_steps; the coordinator
    checks the ranges (decay_steps > warmup_steps, 0 <= min_lr <= lr)."""
    if isinstance(schedule, model_pb2.LrScheduleSpec):
        return schedule
    return _lr_schedule_message(_lr_schedule_fields(schedule))


def optimizer_spec(optimizer, lr_schedule=None):
    """An OptimizerSpec from a message, the CLI's text ("adamw:lr=1e-2,beta1=0", "sgd:lr=0.1,
    momentum=0.9", keys as `pipetrain --optimizer`, read as it reads them) or a dict {"kind":
    "adamw", "lr": 1e-2, ...}. Keys left out take the coordinator's defaults (model.proto). The
    text's and dict's schedule keys lr_schedule, warmup_steps, decay_steps and lr_min (as
    `pipetrain --optimizer`) set OptimizerSpec.lr_schedule; `lr_schedule` (see lr_schedule_spec()),
    as `pipetrain --lr-schedule/--warmup-steps/--lr-decay-steps/--lr-min`, overrides the fields it
    gives (a message: all of them). INVALID_ARGUMENT for an unknown kind or key, a key of the other
    kind, a value that is not a number (an integer for the steps; 0, 1, true or false for
    nesterov) or a decaying schedule without decay_steps; the coordinator checks the ranges."""
    if isinstance(optimizer, model_pb2.OptimizerSpec):
        spec = model_pb2.OptimizerSpec()
        spec.CopyFrom(optimizer)
        if lr_schedule is not None:
            fields = _lr_schedule_fields(spec.lr_schedule) if spec.HasField("lr_schedule") else {}
            fields.update(_lr_schedule_fields(lr_schedule))
            spec.lr_schedule.CopyFrom(_lr_schedule_message(fields))
        return spec
    if isinstance(optimizer, str):
        kind, values = _parse_kind_and_keys(optimizer, "optimizer")
    elif isinstance(optimizer, dict):
        values = dict(optimizer)
        kind = values.pop("kind", None)
    else:
        raise _invalid("optimizer must be an OptimizerSpec, text or a dict, got %s"
                       % type(optimizer).__name__)
    spec = model_pb2.OptimizerSpec()
    schedule = _lr_schedule_fields({_OPTIMIZER_SCHEDULE_KEYS[k]: values.pop(k)
                                    for k in list(values) if k in _OPTIMIZER_SCHEDULE_KEYS})
    if lr_schedule is not None:
        schedule.update(_lr_schedule_fields(lr_schedule))
    if kind == "sgd":
        target, keys = spec.sgd, _SGD_KEYS
        spec.sgd.SetInParent()
    elif kind == "adamw":
        target, keys = spec.adamw, _ADAMW_KEYS
        spec.adamw.SetInParent()
    else:
        raise _invalid("optimizer: unknown kind %r (expected sgd or adamw)" % (kind,))
    for key, value in values.items():
        if key == "clip_norm":
            spec.clip_norm = _number(value, "optimizer: clip_norm")
        elif key not in _SGD_KEYS | _ADAMW_KEYS:
            raise _invalid("optimizer %s: unknown key %r (expected %s or clip_norm)"
                           % (kind, key, ", ".join(sorted(keys))))
        elif key not in keys:
            raise _invalid("optimizer: %s is not a key of %s (it takes %s, clip_norm and the "
                           "schedule's keys)" % (key, kind, ", ".join(sorted(keys))))
        elif key == "nesterov":
            flag = value.strip() if isinstance(value, str) else value
            if flag in (True, 1, "1", "true"):
                target.nesterov = True
            elif flag in (False, 0, "0", "false"):
                target.nesterov = False
            else:
                raise _invalid("optimizer: nesterov must be 0, 1, true or false, got %r" % (value,))
        else:
            setattr(target, key, _number(value, "optimizer %s: %s" % (kind, key)))
    if schedule:
        spec.lr_schedule.CopyFrom(_lr_schedule_message(schedule))
    return spec


def _as_float32(x, what):
    """x (numpy array, torch tensor, nested list) as a C-contiguous little-endian float32 array."""
    if type(x).__module__.split(".")[0] == "torch":  # without importing torch
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.dtype.kind not in "fiub":
        raise _invalid("%s: dtype %s is not numeric" % (what, a.dtype))
    return np.ascontiguousarray(a, dtype="<f4")


def _rows(a, tokens_per_sample, what):
    """`a` as the wire's rank-2 rows: a vector is one value per row; [samples, context] token ids
    of a token model become one id per row."""
    if a.ndim == 1:
        return a.reshape(-1, 1)
    if a.ndim != 2:
        raise _invalid("%s: expected a rank-1 or rank-2 array, got shape %s" % (what, a.shape))
    if tokens_per_sample > 1 and a.shape[1] == tokens_per_sample:
        return a.reshape(-1, 1)
    return a


def _dense(a):
    return pb.DenseTensor(shape=list(a.shape), data=a.tobytes(), dtype=tensor_pb2.DTYPE_F32)


def _data_position(position):
    """A DataPosition from a message or a dict of its fields; INVALID_ARGUMENT otherwise."""
    if isinstance(position, pb.DataPosition):
        return position
    if not isinstance(position, dict):
        raise _invalid("data_position must be a DataPosition or a dict, got %s"
                       % type(position).__name__)
    try:
        return pb.DataPosition(**position)
    except (TypeError, ValueError) as e:
        raise _invalid("data_position: %s" % e) from None


# Makes each pause between two GetJob polls of a recovery wait (tests record the pauses here).
_sleep = time.sleep
# A recovery may itself be interrupted by another loss: at most this many rounds of waiting and
# replaying per call (TrainSession::kRecoveryRounds).
_RECOVERY_ROUNDS = 3


def _recoverable(error):
    """Whether `error` may end once the job has recovered: ABORTED (the job is recovering from a
    lost worker) or UNAVAILABLE (the coordinator went away, maybe restarting on its --state-dir)."""
    return error.code in (StatusCode.ABORTED, StatusCode.UNAVAILABLE)


def _float32_bits(x):
    return np.float32(x).view(np.uint32)


@dataclasses.dataclass
class _Kept:
    """A batch kept for replay: its step (0-based: the job's steps_done before it), the request
    and the loss the first run gave."""

    step: int
    request: pb.TrainRequest
    loss: float


class _TrainStream:
    """One open Train stream: requests go through a queue the gRPC thread reads; answers are read
    in turn. Broken after its first error (the coordinator ended it)."""

    def __init__(self, stub, metadata, target):
        self._target = target
        self._requests = queue.Queue()
        self._responses = stub.Train(iter(self._requests.get, None), metadata=metadata)
        self.broken = False
        self.carried = 0  # how many of the Job's unanswered batches were put on this stream.

    def put(self, request):
        """Queues `request` for sending (never blocks; a broken stream shows in get())."""
        self._requests.put(request)

    def step(self, request):
        self.put(request)
        return self.get()

    def get(self):
        """The next answer; raises the stream's error (and marks it broken)."""
        try:
            return next(self._responses)
        except grpc.RpcError as e:
            self._end()
            raise PipetrainError.from_rpc_error(e, "Train", self._target) from None
        except StopIteration:
            # The coordinator ends a stream OK only after the client closed its side: an OK end
            # while a batch waits for its answer is a coordinator that went away (a replaying Job
            # then checks the job before it resends anything).
            self._end()
            raise PipetrainError(
                StatusCode.UNAVAILABLE,
                "the coordinator ended the Train stream without answering the batch",
                "Train") from None

    def _end(self):
        """Marks the stream broken and ends its request iterator (gRPC's thread reading it)."""
        self.broken = True
        self._requests.put(None)

    def close(self):
        """Ends the stream in order: half-closes it, reads what the coordinator still sends and
        waits for its end; errors are not reported (the step that met them already was). Never a
        cancel where another stream follows: the coordinator notices a cancelled stream on its own
        time, and the next stream's claim could still find the old one holding the job
        (FAILED_PRECONDITION); it releases a closed one before the end reaches the client."""
        self._requests.put(None)
        try:
            for _ in self._responses:
                pass
        except grpc.RpcError:
            pass

    def cancel(self):
        self._requests.put(None)
        self._responses.cancel()


class Job:
    """A job on the coordinator (made by Client.create_job or Client.job). As a context manager
    it ends the job on leaving: FinishJob (DONE) normally, CancelJob when an exception leaves the
    block, so its workers are freed at once either way — except when the job's last checkpoint()
    failed (failed_checkpoint): its weights are then unsaved, so the job is left to the
    coordinator with them (its Train stream cancelled) for a retry of the save
    (client.job(id).checkpoint(DIR) or `pipetrain checkpoint ID --save DIR`), until a client ends
    it or the coordinator's client lease does (no call naming the job for --client-lease, 5 min by
    default); a note on the exception says so. The C++ SDK's ScopedJob does the same.

    Recovery (a job created with recover=True, the default; docs/python.md "Recovery"): step(),
    send() and train() keep the requests sent since the last completed checkpoint() (at most
    `max_kept_batches`; older ones are dropped). When a step fails with ABORTED (the job is
    recovering from a lost worker) or UNAVAILABLE (the coordinator went away), the job waits until
    the coordinator has it READY again (polling GetJob with pauses from 20 ms doubling up to
    `max_poll_interval` s; at most `recovery_timeout` s in all and `reconnect_timeout` s while the
    coordinator is unreachable), resends the kept batches from the step it restarted at on a new
    Train stream, checking each replayed loss is bit for bit the first run's (DATA_LOSS
    otherwise), then the failed batch: at most 3 rounds per step (a replay or retried step
    interrupted by another loss starts the next; the wait's own errors end it at once).
    `on_wait(error)` (if given) is called when a wait begins, with the error that began it.
    Each recovery's RecoveryEvent is passed to `on_recovery` (if given), appended to
    `recoveries` and attached to the StepResult it preceded. A step the coordinator applied at
    an earlier step than the next (it recovered while the stream was idle) raises DATA_LOSS.

    Changes of shape (a job created with max_stages; docs/scaling.md "Jobs that change shape"):
    a result whose proto has shape_change (the job grew onto idle workers just before that step,
    or a growth failed and it kept its shape) passes it to `on_shape_change` (if given), appends
    it to `shape_changes` and attaches it to the StepResult (its shape_change). Nothing is
    replayed: the growth's checkpoint only drops the kept batches before it, as checkpoint()
    does."""

    # Batches send() may have unanswered: the coordinator's running step and one read ahead.
    MAX_IN_FLIGHT = 2

    def __init__(self, client, status, *, max_kept_batches=10000, recovery_timeout=300.0,
                 reconnect_timeout=60.0, max_poll_interval=0.2, on_recovery=None, on_wait=None,
                 on_shape_change=None):
        self._check_options(max_kept_batches, recovery_timeout, reconnect_timeout,
                            max_poll_interval, on_recovery, on_wait, on_shape_change)
        self._client = client
        self.id = status.job
        self.spec = status.spec  # as the coordinator runs it: model sizes, V, threads filled in.
        self._tokens_per_sample = 1
        for layer in status.spec.model.layers:
            if layer.HasField("embedding"):
                self._tokens_per_sample = layer.embedding.context
        self._stream = None
        self._ended = False
        # Replay state: on when the coordinator recovers the job (JobSpec.recover).
        self._replay = status.spec.recover
        self._max_kept_batches = max_kept_batches
        self._recovery_timeout = recovery_timeout
        self._reconnect_timeout = reconnect_timeout
        self._max_poll_interval = max_poll_interval
        self._on_recovery = on_recovery
        self._on_wait = on_wait
        self._kept = collections.deque()
        self._sent = collections.deque()  # requests sent by send() and not yet answered.
        self._next_step = status.steps_done  # steps answered: the 0-based step of the next one.
        self._pending_recoveries = []  # since the last StepResult returned.
        self.recoveries = []  # every RecoveryEvent this Job replayed through, in order.
        self._on_shape_change = on_shape_change
        self.shape_changes = []  # every ShapeChange its results reported, in order.

    @staticmethod
    def _check_options(max_kept_batches, recovery_timeout, reconnect_timeout, max_poll_interval,
                       on_recovery, on_wait, on_shape_change=None):
        """INVALID_ARGUMENT naming the first replay option that is not usable (as
        TrainOptions::Check)."""
        if not isinstance(max_kept_batches, int) or max_kept_batches < 1:
            raise _invalid("max_kept_batches must be >= 1, got %r" % (max_kept_batches,))
        for name, value in (("recovery_timeout", recovery_timeout),
                            ("reconnect_timeout", reconnect_timeout),
                            ("max_poll_interval", max_poll_interval)):
            if not isinstance(value, (int, float)) or not value > 0:
                raise _invalid("%s must be positive, got %r s" % (name, value))
        for name, callback in (("on_recovery", on_recovery), ("on_wait", on_wait),
                               ("on_shape_change", on_shape_change)):
            if callback is not None and not callable(callback):
                raise _invalid("%s must be callable, got %s" % (name, type(callback).__name__))

    def __repr__(self):
        return "Job(%r)" % self.id

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._ended:
            return False
        if exc_type is None:
            self.finish()
        elif self.failed_checkpoint is not None:
            # The weights are unsaved: leave the job, without a client, for a retry of the save.
            self._sent.clear()
            if self._stream is not None:
                self._stream.cancel()
                self._stream = None
            if exc is not None and hasattr(exc, "add_note"):
                exc.add_note(
                    "job %s keeps its weights: save them with client.job(%r).checkpoint(%r) or "
                    "`pipetrain checkpoint %s --save %s`, or free its workers with cancel(); the "
                    "coordinator cancels it after its client lease with no call naming it"
                    % (self.id, self.id, self.failed_checkpoint, self.id, self.failed_checkpoint))
        else:
            try:
                self.cancel("the Python client stopped: %s: %s" % (exc_type.__name__, exc))
            except PipetrainError:
                pass  # best effort: the coordinator's client lease ends the job otherwise.
        return False

    @property
    def failed_checkpoint(self):
        """The directory of this job's last checkpoint() through its Client if it failed (its
        weights are unsaved), else None (Client.failed_checkpoint)."""
        return self._client.failed_checkpoint(self.id)

    def status(self):
        """The job's JobStatus message (state, steps_done, stages, spec, reason, ...)."""
        return self._client._call("GetJob", pb.GetJobRequest(job=self.id))

    def request(self, inputs, targets, samples=None):
        """The TrainRequest of a batch: `inputs` [rows, input_features] (token models: [samples,
        context] ids), `targets` [rows, target_features] or [rows] labels; numpy arrays, torch
        tensors or lists, converted to float32. samples: rows / tokens_per_sample unless given."""
        x = _rows(_as_float32(inputs, "inputs"), self._tokens_per_sample, "inputs")
        y = _rows(_as_float32(targets, "targets"), self._tokens_per_sample, "targets")
        if samples is None:
            if x.shape[0] % self._tokens_per_sample:
                raise _invalid("inputs: %d rows are not a whole number of samples of %d tokens"
                               % (x.shape[0], self._tokens_per_sample))
            samples = x.shape[0] // self._tokens_per_sample
        return pb.TrainRequest(job=self.id, samples=samples, inputs=_dense(x), targets=_dense(y))

    @property
    def kept_batches(self):
        """How many batches are kept for a replay (those since the last checkpoint)."""
        return len(self._kept)

    def step(self, inputs, targets, samples=None):
        """Trains one step on one batch (see request()) and returns its StepResult. On the job's
        open Train stream (opened at the first step); after an error the next step opens a new one
        (the job stays at the same step: a failed step is applied nowhere). With recovery on, an
        ABORTED or UNAVAILABLE step is retried after the job recovered (see the class comment);
        the errors then are those of the recovery: FAILED_PRECONDITION if the job ended or the
        kept batches do not reach back to its restored step, DEADLINE_EXCEEDED after
        recovery_timeout, UNAVAILABLE after reconnect_timeout, DATA_LOSS if a replayed loss
        differs. FAILED_PRECONDITION while batches sent by send() are unanswered."""
        if self._sent:
            raise PipetrainError(StatusCode.FAILED_PRECONDITION,
                                 "step() with %d batch(es) sent and unanswered: receive() first"
                                 % len(self._sent), "Train")
        self.send(inputs, targets, samples)
        return self.receive()

    def send(self, inputs, targets, samples=None):
        """Sends a batch (see request()) without waiting for its result, which receive() returns:
        the coordinator reads one batch ahead and starts its step as soon as the previous step is
        committed, so a loop that sends batch k+1 before it receives result k prepares its next
        batch while the job trains. At most MAX_IN_FLIGHT batches may be unanswered, and
        checkpoint() waits for none of them: receive() them first (FAILED_PRECONDITION
        otherwise). A broken stream is reported (or recovered from) by receive()."""
        if len(self._sent) >= self.MAX_IN_FLIGHT:
            raise PipetrainError(StatusCode.FAILED_PRECONDITION,
                                 "%d batches are sent and unanswered: receive() one before "
                                 "sending another" % self.MAX_IN_FLIGHT, "Train")
        request = self.request(inputs, targets, samples)
        if self._replay:
            # Names the step the batch is for: a job restored between two steps refuses it
            # (ABORTED, then replayed) instead of applying it at the restored step.
            request.expected_steps_done = self._next_step + len(self._sent)
        self._sent.append(request)
        self._put_unsent()

    def receive(self):
        """Waits for and returns the StepResult of the oldest batch sent and not yet answered
        (FAILED_PRECONDITION if there is none). Recovers as step() does: the kept batches are
        replayed, then the unanswered ones resent. On an error the unanswered batches are dropped
        (none of them was applied after the failed one) and it is raised as step() raises it."""
        if not self._sent:
            raise PipetrainError(StatusCode.FAILED_PRECONDITION,
                                 "no batch is sent and unanswered", "Train")

        def attempt():
            self._put_unsent()
            return self._stream.get()

        try:
            result = self._through_recovery(attempt)
        except PipetrainError:
            self._drop_unanswered()
            raise
        request = self._sent.popleft()
        self._stream.carried -= 1
        if self._replay and result.step != self._next_step + 1:
            # The coordinator recovered the job while this stream was idle and applied the batch
            # at its restored step: the state is no longer the first run's.
            self._drop_unanswered()
            raise PipetrainError(
                StatusCode.DATA_LOSS,
                "job %s applied this batch as step %d, expected step %d: it restarted from an "
                "earlier step between two steps without ending the Train stream, so the batches "
                "since were not replayed" % (self.id, result.step, self._next_step + 1), "Train")
        self._next_step = result.step
        if self._replay:
            self._kept.append(_Kept(result.step - 1, request, result.loss))
            while len(self._kept) > self._max_kept_batches:
                self._kept.popleft()
        if result.HasField("shape_change"):
            change = result.shape_change
            # A growth takes a checkpoint: a recovery restarts from it at the earliest. Nothing is
            # replayed for a growth (the stream goes on).
            if change.checkpoint:
                while self._kept and self._kept[0].step < change.step:
                    self._kept.popleft()
            self.shape_changes.append(change)
            if self._on_shape_change is not None:
                self._on_shape_change(change)
        recoveries, self._pending_recoveries = self._pending_recoveries, []
        return StepResult.from_proto(result, recoveries)

    @property
    def in_flight(self):
        """Batches sent by send() and not yet answered."""
        return len(self._sent)

    def _drop_unanswered(self):
        """After an error: forgets the unanswered batches and ends the stream in order if it is
        still open (the next batch opens a new one)."""
        self._sent.clear()
        self._end_stream()

    def _end_stream(self):
        """Ends the current stream in order if it is still open (_TrainStream.close) and forgets
        it."""
        if self._stream is not None and not self._stream.broken:
            self._stream.close()
        self._stream = None

    def _put_unsent(self):
        """Puts the unanswered batches the open Train stream does not carry yet on it (a new
        stream if there is none or it broke)."""
        if self._stream is None or self._stream.broken:
            self._open_stream()
        while self._stream.carried < len(self._sent):
            self._stream.put(self._sent[self._stream.carried])
            self._stream.carried += 1

    def _through_recovery(self, attempt):
        """attempt()'s value; when it raises a recoverable error and replay is on, waits for the
        job to recover, replays the kept batches and calls attempt() again: at most 3 rounds (a
        loss during the replay or the retried attempt starts the next). The waits' own errors
        (the job ended, timeouts) and a DATA_LOSS end it at once."""
        try:
            return attempt()
        except PipetrainError as e:
            error = e
        for _ in range(_RECOVERY_ROUNDS):
            if not (self._replay and _recoverable(error)):
                break
            if self._on_wait is not None:
                self._on_wait(error)
            status = self._await_ready(error)
            try:
                self._replay_kept(status, error)
                return attempt()
            except PipetrainError as e:
                error = e
        raise error

    def _open_stream(self):
        self._stream = _TrainStream(self._client._stub, self._client._metadata,
                                    self._client.address)

    def _step_once(self, request):
        """One step on the open Train stream (a new one if there is none or it broke); for the
        replay, before the unanswered batches are resent."""
        if self._stream is None or self._stream.broken:
            self._open_stream()
        return self._stream.step(request)

    def _await_ready(self, why):
        """Polls GetJob until the job is READY again and returns its JobStatus; raises what the
        class comment says when it does not get there."""
        deadline = time.monotonic() + self._recovery_timeout
        delay = min(0.02, self._max_poll_interval)
        # Since when the coordinator has been unreachable (the UNAVAILABLE that began the wait
        # counts); None while it answers.
        unreachable_since = time.monotonic() if why.code == StatusCode.UNAVAILABLE else None
        # Each poll is short, so that an unreachable coordinator is given up on in time.
        poll_timeout = min(max(self._reconnect_timeout, 1.0), self._client._timeout, 5.0)
        while True:
            last = None
            try:
                status = self._client._call("GetJob", pb.GetJobRequest(job=self.id),
                                            timeout=poll_timeout)
            except PipetrainError as e:
                last = e
                if e.code == StatusCode.NOT_FOUND:
                    raise PipetrainError(
                        StatusCode.FAILED_PRECONDITION,
                        "job %s is unknown to the coordinator at %s after: %s (a coordinator "
                        "restarted without --state-dir forgets its jobs)"
                        % (self.id, self._client.address, why)) from None
                if e.code not in (StatusCode.UNAVAILABLE, StatusCode.DEADLINE_EXCEEDED):
                    raise
                now = time.monotonic()
                unreachable_since = now if unreachable_since is None else unreachable_since
                if now - unreachable_since >= self._reconnect_timeout:
                    raise PipetrainError(
                        StatusCode.UNAVAILABLE,
                        "%s; the coordinator was not reachable again within %gs"
                        % (why.message if why.code == StatusCode.UNAVAILABLE else e.message,
                           self._reconnect_timeout), why.method) from None
            else:
                unreachable_since = None
                if status.state == pb.JOB_STATE_READY:
                    return status
                if status.state not in (pb.JOB_STATE_RECOVERING, pb.JOB_STATE_TRAINING):
                    if why.code == StatusCode.UNAVAILABLE:
                        raise why  # the lost connection's own error says more.
                    raise PipetrainError(
                        StatusCode.FAILED_PRECONDITION,
                        "job %s did not recover: %s%s" % (
                            self.id, pb.JobState.Name(status.state),
                            ": " + status.reason if status.reason else ""))
            if time.monotonic() >= deadline:
                raise PipetrainError(
                    StatusCode.DEADLINE_EXCEEDED,
                    "job %s did not recover within %gs after: %s%s"
                    % (self.id, self._recovery_timeout, why,
                       "; last attempt: %s" % last if last is not None else ""))
            _sleep(delay)  # polling interval of a bounded wait.
            delay = min(delay * 2, self._max_poll_interval)

    def _replay_kept(self, status, why):
        """With the job READY again (its JobStatus `status`) after `why`, opens a new Train stream
        and replays the kept batches from the restored step, checking each loss bit for bit; then
        reports the recovery. Raises as step() says."""
        restored = status.steps_done
        first_kept = self._kept[0].step if self._kept else self._next_step
        if restored > self._next_step:
            # The job applied batches whose results never arrived (the stream broke after their
            # steps): their losses are unknown here, so the Job cannot continue exactly.
            raise PipetrainError(
                StatusCode.FAILED_PRECONDITION,
                "job %s has done %d steps but this Job received the results of %d: the results "
                "of the steps after it were lost with the Train stream (%s)"
                % (self.id, restored, self._next_step, why))
        if restored < first_kept:
            raise PipetrainError(
                StatusCode.FAILED_PRECONDITION,
                "job %s restarted at step %d but this Job can replay only steps %d to %d "
                "(checkpoint more often to keep fewer batches)"
                % (self.id, restored, first_kept, self._next_step))
        # A new stream for the new generation, after the current one (open when another call failed,
        # e.g. a checkpoint) ended in order.
        self._end_stream()
        for kept in self._kept:
            if kept.step < restored:
                continue
            kept.request.expected_steps_done = kept.step
            replayed = self._step_once(kept.request)
            if (replayed.step != kept.step + 1
                    or _float32_bits(replayed.loss) != _float32_bits(kept.loss)):
                raise PipetrainError(
                    StatusCode.DATA_LOSS,
                    "replaying step %d of job %s gave step %d loss %.9g, the first run loss %.9g: "
                    "the recovery is not exact"
                    % (kept.step + 1, self.id, replayed.step, replayed.loss, kept.loss))
        if status.recoveries:
            event = status.recoveries[-1]
            self.recoveries.append(event)
            self._pending_recoveries.append(event)
            if self._on_recovery is not None:
                self._on_recovery(event)

    def train(self, batches, steps=None, progress=None):
        """Trains on `batches`, an iterable of (inputs, targets) pairs (e.g. pipetrain.data.batches
        or a torch DataLoader), at most `steps` of them; yields each step's StepResult. progress:
        a tqdm progress bar (python3-tqdm, if installed) when True, or when None and stderr is a
        terminal."""
        if steps is not None:
            total = steps
            batches = itertools.islice(batches, steps)
        else:
            total = len(batches) if hasattr(batches, "__len__") else None
        bar = None
        if progress or (progress is None and sys.stderr.isatty()):
            try:
                from tqdm import tqdm
                bar = tqdm(total=total, unit="step", desc=self.id)
            except ImportError:
                bar = None
        try:
            for batch in batches:
                inputs, targets = batch[0], batch[1]
                result = self.step(inputs, targets)
                if bar is not None:
                    bar.set_postfix(loss="%.4f" % result.loss,
                                    bubble="%.2f" % result.bubble_fraction, refresh=False)
                    bar.update(1)
                yield result
        finally:
            if bar is not None:
                bar.close()

    def checkpoint(self, directory, keep=1, data_position=None):
        """Writes a checkpoint of the job's state to `directory` on the coordinator's host (under
        its --checkpoint-root; a relative path is made absolute here, as the CLI does), keeping
        `keep` checkpoints of it (CheckpointRequest.keep). data_position: the data set and the
        position of the next batch for the manifest (CheckpointRequest.data_position), a
        DataPosition message or a dict of its fields (data, batch_size, cursor_epoch,
        cursor_batch). Returns the CheckpointResponse (step, directory, data_position). Allowed
        between steps of an open stream. With recovery on, a checkpoint interrupted by a recovery
        (ABORTED, UNAVAILABLE) is retried after the replay (at most 3 rounds), and a completed one
        drops the kept batches before its step. A failure is remembered (failed_checkpoint) until
        a checkpoint of the job succeeds or it is finished or cancelled."""
        if self._sent:
            raise PipetrainError(StatusCode.FAILED_PRECONDITION,
                                 "checkpoint() with %d batch(es) sent and unanswered: receive() "
                                 "first" % len(self._sent), "Checkpoint")
        if not os.path.isabs(directory):
            directory = os.path.abspath(directory)
        request = pb.CheckpointRequest(job=self.id, directory=directory, keep=keep)
        if data_position is not None:
            request.data_position.CopyFrom(_data_position(data_position))
        response = self._through_recovery(lambda: self._client._checkpoint(request))
        # A recovery restarts from this step at the earliest.
        while self._kept and self._kept[0].step < response.step:
            self._kept.popleft()
        return response

    def evaluate(self, inputs, targets, samples=None, chunk_samples=0):
        """Evaluates held-out samples (as request(): `inputs`, `targets`, `samples`) on the job's
        committed weights with a forward-only pass over its pipeline, between two steps (the
        Evaluate RPC; nothing of the job changes). The samples are evaluated in chunks of
        chunk_samples (0: 256, as `pipetrain evaluate`; capped by the model's activation limit as
        it caps it). Returns the EvaluateResult message: loss (mean per row), accuracy, samples,
        rows, correct, step (the weights' step), chunk_samples and per-chunk figures (chunks:
        samples, rows, loss_sum, correct) — bitwise `pipetrain evaluate`'s on a checkpoint of the
        same weights. Allowed between steps of an open stream; with recovery on, an evaluation
        interrupted by a recovery is retried after the replay, as checkpoint() is. Errors:
        INVALID_ARGUMENT for a bad batch, RESOURCE_EXHAUSTED beyond 4096 chunks,
        FAILED_PRECONDITION while batches are unanswered or the job is not READY."""
        if self._sent:
            raise PipetrainError(StatusCode.FAILED_PRECONDITION,
                                 "evaluate() with %d batch(es) sent and unanswered: receive() "
                                 "first" % len(self._sent), "Evaluate")
        batch = self.request(inputs, targets, samples)
        request = pb.EvaluateRequest(job=self.id, samples=batch.samples, inputs=batch.inputs,
                                     targets=batch.targets, chunk_samples=chunk_samples)
        return self._through_recovery(
            lambda: self._client._call("Evaluate", request, long=True))

    def generate(self, prompts, max_tokens=200, temperature=1.0, top_k=0, seed=0):
        """Generates max_tokens tokens after each prompt from the job's committed weights (a
        language model) between two steps (the Generate RPC): every prompt is decoded with a KV
        cache on the job's workers, the prompts micro-batched through the pipeline together, and
        the coordinator samples each next token (temperature 0: greedy; top_k 0: the whole
        vocabulary) with a sampler per prompt seeded with `seed`. `prompts`: a list of prompts,
        each a sequence of token ids (for a text data set, token i is data.vocabulary[i]), or one
        such sequence. Returns the GenerateResult message: sequences[i].tokens (prompt i's tokens,
        without the prompt), step (the weights' step), rounds, generate_ms — exactly the tokens
        `pipetrain generate --resume` gives each prompt on a checkpoint of the same weights with
        the same options (pipetrain.generate). Allowed between steps of an open stream; retried
        after a recovery as checkpoint() is. Errors: INVALID_ARGUMENT for a bad prompt or option,
        RESOURCE_EXHAUSTED beyond 64 prompts or 4096 tokens, FAILED_PRECONDITION while batches
        are unanswered or for a job that is not READY or not a language model."""
        if self._sent:
            raise PipetrainError(StatusCode.FAILED_PRECONDITION,
                                 "generate() with %d batch(es) sent and unanswered: receive() "
                                 "first" % len(self._sent), "Generate")
        prompts = list(prompts)
        if prompts and np.ndim(prompts[0]) == 0:
            prompts = [prompts]  # one prompt
        request = pb.GenerateRequest(job=self.id, max_tokens=int(max_tokens),
                                     temperature=float(temperature), top_k=int(top_k),
                                     seed=int(seed))
        for prompt in prompts:
            request.prompts.add(tokens=[int(t) for t in prompt])
        return self._through_recovery(
            lambda: self._client._call("Generate", request, long=True))

    def finish(self):
        """Closes the Train stream and ends the job as DONE (FinishJob), freeing its workers.
        Returns the final JobStatus."""
        self._close_stream()
        status = self._client._call("FinishJob", pb.FinishJobRequest(job=self.id))
        self._client._failed_checkpoints.pop(self.id, None)
        self._ended = True
        return status

    def cancel(self, reason=""):
        """Ends the job at once (CancelJob: a step in flight is aborted), freeing its workers.
        OK for a job that already ended. Returns the final JobStatus."""
        status = self._client._call("CancelJob", pb.CancelJobRequest(job=self.id, reason=reason))
        self._client._failed_checkpoints.pop(self.id, None)
        self._ended = True
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None
        return status

    def _close_stream(self):
        self._sent.clear()  # the coordinator answers them before it ends the stream.
        if self._stream is not None:
            self._stream.close()
            self._stream = None


def _read_file(path):
    with open(path, "rb") as f:
        return f.read()


def _channel_credentials(tls):
    """grpc.ChannelCredentials of `tls`: True (the system's CA roots), a CA file path, or a dict
    {"ca": path, "cert": path, "key": path} (any may be left out; cert and key for mutual TLS)."""
    if tls is True:
        return grpc.ssl_channel_credentials()
    if isinstance(tls, (str, os.PathLike)):
        tls = {"ca": tls}
    if not isinstance(tls, dict) or not set(tls) <= {"ca", "cert", "key"}:
        raise _invalid("tls must be True, a CA file path or a dict with keys ca, cert, key")
    if ("cert" in tls) != ("key" in tls):
        raise _invalid("tls: cert and key go together")
    try:
        return grpc.ssl_channel_credentials(
            root_certificates=_read_file(tls["ca"]) if "ca" in tls else None,
            private_key=_read_file(tls["key"]) if "key" in tls else None,
            certificate_chain=_read_file(tls["cert"]) if "cert" in tls else None)
    except OSError as e:
        raise _invalid("tls: %s" % e) from None


# Calls that change nothing (and CancelJob, which is idempotent) are retried by gRPC when the
# connection under them broke (UNAVAILABLE), e.g. the first call after a coordinator restart; the
# call's deadline bounds the attempts. The C++ SDK's (client/sdk/client.cc).
_SERVICE_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": "pipetrain.v1.Coordinator", "method": m}
             for m in ("GetJob", "ListJobs", "ListWorkers", "CancelJob")],
    "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
                    "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]})


class Client:
    """A connection to a coordinator at `address` ("host:port").

    token: sent as `authorization: Bearer <token>` metadata on every call; default: the
    environment variable PIPETRAIN_TOKEN, if set. tls: None (plaintext), True, a CA file path or
    {"ca", "cert", "key"} paths. Liveness as the C++ SDK's ClientOptions: a keepalive ping after
    `keepalive` s of silence, the connection dropped after `keepalive` s more without a reply;
    unary calls have `timeout` s (CreateJob and Checkpoint `long_timeout`). Waits up to
    `connect_timeout` s for the channel (UNAVAILABLE otherwise)."""

    def __init__(self, address, token=None, tls=None, *, connect_timeout=10.0, timeout=30.0,
                 long_timeout=600.0, keepalive=5.0):
        if not isinstance(keepalive, (int, float)) or keepalive < 1:
            # The coordinator accepts pings every half second or slower (more frequent ones make
            # it close the connection): as ClientOptions::Check, at least 1 s.
            raise _invalid("keepalive must be at least 1 s, got %r" % (keepalive,))
        self.address = address
        self._timeout = timeout
        self._long_timeout = long_timeout
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        self._metadata = ((TOKEN_METADATA_KEY, "Bearer " + token),) if token else ()
        options = [
            ("grpc.keepalive_time_ms", int(keepalive * 1000)),
            ("grpc.keepalive_timeout_ms", int(keepalive * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.max_send_message_length", -1),
            ("grpc.max_receive_message_length", -1),
            # A coordinator that restarts is reconnected within a few seconds (gRPC's default
            # backoff grows to 120 s), as the C++ SDK.
            ("grpc.max_reconnect_backoff_ms", 5000),
            ("grpc.service_config", _SERVICE_CONFIG),
        ]
        if tls:
            self._channel = grpc.secure_channel(address, _channel_credentials(tls), options)
        else:
            self._channel = grpc.insecure_channel(address, options)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=connect_timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise PipetrainError(StatusCode.UNAVAILABLE,
                                 "cannot reach the coordinator at %s within %gs"
                                 % (address, connect_timeout)) from None
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)
        # By job id: the directory of its last Checkpoint through this client, which failed.
        self._failed_checkpoints = {}

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False

    def close(self):
        """Closes the connection (open Train streams end)."""
        self._channel.close()

    def create_job(self, model, schedule="1f1b", stages=1, microbatches=1, optimizer="adamw",
                   seed=0, threads=1, virtual_stages=0, data=None, resume_from=None,
                   recover=True, replace_timeout=30.0, min_stages=0, lr_schedule=None, *,
                   isa=None, save_to=None, keep_checkpoints=1, planned_steps=0, replicas=1,
                   max_stages=0, max_replicas=0,
                   max_kept_batches=10000, recovery_timeout=300.0,
                   reconnect_timeout=60.0, max_poll_interval=0.2, on_recovery=None, on_wait=None,
                   on_shape_change=None):
        """Creates a job and returns it once every worker is ready (a Job, also a context manager).

        model: ModelSpec, path or text (sizes left 0 are filled by the coordinator from `data`).
        schedule: gpipe | 1f1b | interleaved | zb-h1 | zb-v | dualpipe-v | 1f1b-overlap |
            interleaved-overlap | dualpipe (two copies of the stages, S and M even). stages: S.
            replicas: R data-parallel copies of the pipeline on R x S workers (JobSpec.replicas,
            as `pipetrain train --replicas`), each running M / R of every step's micro-batches: a
            power of two dividing M (INVALID_ARGUMENT naming the counts M supports otherwise); the
            result is bitwise that of one replica (docs/scaling.md, "Replicas"); 1 with dualpipe.
        microbatches: M (divides every batch). optimizer: see optimizer_spec(). seed: initial
        weights. threads: compute threads per worker. virtual_stages: V (0: the schedule's).
        data: a pipetrain.data.Dataset or a dict of DataShape fields (a text data set loaded with a
        tokenizer also sends the tokenizer: JobSpec.tokenizer). resume_from: a checkpoint
        directory on the coordinator's host. lr_schedule: the learning-rate schedule (see
        lr_schedule_spec()), OptimizerSpec.lr_schedule as `pipetrain --lr-schedule KIND
        --warmup-steps N --lr-decay-steps N --lr-min X` sets it: the fields it gives override the
        optimizer text's (see optimizer_spec()). None: the optimizer's (by default constant).
        isa: the instruction-set level every rank runs the math at (JobSpec.isa, as `pipetrain
        train --isa`: "x86-64-v3", "x86-64-v4", "generic"); None: the highest level all the
        job's workers run (the level chosen is job.status().spec.isa). save_to: the checkpoint
        directory the job will save into, on the coordinator's host (made absolute here;
        JobSpec.save_to, as `pipetrain train --save`): checked when the job is created — under
        the --checkpoint-root (PERMISSION_DENIED), replaceable, written by no other job
        (FAILED_PRECONDITION naming it) — and the job's own until it ends; keep_checkpoints: the
        `keep` its checkpoints there will ask for (JobSpec.keep_checkpoints).
        planned_steps: the steps you mean to run (JobSpec.planned_steps, as `pipetrain train
        --steps` sends it): the target of the job's progress and ETA (status().progress,
        `pipetrain jobs`); 0: unknown.

        Recovery (docs/python.md "Recovery"): recover: the coordinator recovers the job from a
        lost worker (JobSpec.recover; on by default, as `pipetrain train`) and the Job replays
        the batches since its last checkpoint. replace_timeout: seconds an idle worker is waited
        for to take a lost rank (JobSpec.replace_timeout_ms). min_stages: with recover, shrink
        onto the survivors down to this many stages when none comes (0: never shrink).
        max_stages, max_replicas: grow onto idle workers at a step boundary, after a checkpoint the
        job takes for it, up to this many stages / replicas (JobSpec.max_stages, max_replicas, as
        `pipetrain train --max-stages`; docs/scaling.md "Jobs that change shape"); 0: never.
        Each change is in job.shape_changes and the StepResult it preceded.
        max_kept_batches, recovery_timeout, reconnect_timeout, max_poll_interval, on_recovery,
        on_wait, on_shape_change: see Job."""
        if replace_timeout < 0:
            raise _invalid("replace_timeout must be >= 0 s, got %r" % (replace_timeout,))
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise _invalid("replicas must be an integer >= 1, got %r" % (replicas,))
        spec = pb.JobSpec(schedule=schedule, stages=stages, microbatches=microbatches,
                          virtual_stages=virtual_stages, seed=seed, threads=threads,
                          recover=recover, replace_timeout_ms=int(round(replace_timeout * 1000)),
                          min_stages=min_stages, planned_steps=planned_steps, replicas=replicas,
                          max_stages=max_stages, max_replicas=max_replicas)
        if isa is not None:
            if not isinstance(isa, str):
                raise _invalid("isa must be a level name such as 'x86-64-v4', got %r" % (isa,))
            spec.isa = isa
        spec.model.CopyFrom(model_spec(model))
        spec.optimizer.CopyFrom(optimizer_spec(optimizer, lr_schedule))
        if data is not None:
            shape = data.shape if hasattr(data, "shape") and isinstance(data.shape, dict) else data
            try:
                spec.data_shape.CopyFrom(pb.DataShape(**shape))
            except (TypeError, ValueError) as e:
                raise _invalid("data: %s" % e) from None
            # Text read through a tokenizer: the job writes it into every checkpoint.
            tokenizer = getattr(data, "tokenizer", None)
            if tokenizer is not None:
                spec.tokenizer = tokenizer.model
        if resume_from:
            spec.resume_from = os.path.abspath(resume_from)
        if save_to:
            spec.save_to = os.path.abspath(save_to)
            spec.keep_checkpoints = keep_checkpoints
        job_options = dict(max_kept_batches=max_kept_batches, recovery_timeout=recovery_timeout,
                           reconnect_timeout=reconnect_timeout,
                           max_poll_interval=max_poll_interval, on_recovery=on_recovery,
                           on_wait=on_wait, on_shape_change=on_shape_change)
        Job._check_options(**job_options)  # before the job takes its workers.
        status = self._call("CreateJob", pb.CreateJobRequest(spec=spec), long=True)
        return Job(self, status, **job_options)

    def job(self, job_id, **job_options):
        """The Job of an existing id (to train more, check or end it). NOT_FOUND if unknown.
        job_options: Job's max_kept_batches, recovery_timeout, reconnect_timeout,
        max_poll_interval, on_recovery, on_wait (a replay reaches back only to the steps this Job
        object sent)."""
        return Job(self, self._call("GetJob", pb.GetJobRequest(job=job_id)), **job_options)

    def watch(self, job_id, after_sequence=0):
        """Follows a job that any client trains (WatchJob, as `pipetrain watch`): yields its
        JobEvent messages — first its status (event.status), then the events its coordinator
        still keeps after number `after_sequence` (0: all it keeps), then each as it happens
        (step, recovering, recovered, checkpoint, skipped) — and ends after its `ended` event.
        Watching does not keep the job alive. Closing the generator ends the stream. Errors:
        PipetrainError (NOT_FOUND for an unknown job or another owner's)."""
        call = self._stub.WatchJob(pb.WatchJobRequest(job=job_id, after_sequence=after_sequence),
                                   metadata=self._metadata)
        try:
            for event in call:
                yield event
        except grpc.RpcError as e:
            raise PipetrainError.from_rpc_error(e, "WatchJob", self.address) from None
        finally:
            call.cancel()

    def jobs(self):
        """Every JobStatus the coordinator knows (ended ones for its retention period)."""
        return list(self._call("ListJobs", pb.ListJobsRequest()).jobs)

    def workers(self):
        """Every live worker (WorkerInfo messages: name, address, job, rank, ...)."""
        return list(self._call("ListWorkers", pb.ListWorkersRequest()).workers)

    def failed_checkpoint(self, job_id):
        """The directory of job `job_id`'s last Checkpoint through this client if it failed (the
        job's weights are unsaved: a Job's `with` block then leaves the job for a retry), else
        None; cleared by a successful one, finish() or cancel() (Client::failed_checkpoint)."""
        return self._failed_checkpoints.get(job_id)

    def _checkpoint(self, request):
        """One Checkpoint call, its failure remembered for failed_checkpoint()."""
        try:
            response = self._call("Checkpoint", request, long=True)
        except PipetrainError:
            self._failed_checkpoints[request.job] = request.directory
            raise
        self._failed_checkpoints.pop(request.job, None)
        return response

    def _call(self, method, request, long=False, timeout=None):
        """One unary call; its deadline `timeout` s, else long_timeout if `long`, else timeout."""
        if timeout is None:
            timeout = self._long_timeout if long else self._timeout
        try:
            return getattr(self._stub, method)(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise PipetrainError.from_rpc_error(e, method, self.address) from None
