"""A coordinator and stage workers on this machine, for notebooks, examples and tests: the
Python counterpart of `pipetrain local`'s daemons (127.0.0.1 only).

    with pipetrain.local.LocalCluster(workers=2, build_dir="build") as cluster:
        with pipetrain.Client(cluster.address) as client: ...
"""

import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time

from pipetrain.errors import PipetrainError, StatusCode


# The environment variables naming the daemons' binaries (PIPETRAIN_COORDINATOR is the CLI's
# coordinator address, never a binary).
COORDINATOR_BINARY_ENV = "PIPETRAIN_COORDINATOR_BINARY"
STAGE_WORKER_BINARY_ENV = "PIPETRAIN_STAGE_WORKER_BINARY"


def _find_binary(name, explicit, env, build_dir, subdir, argument):
    """The daemon binary: `explicit`, else $env, else build_dir/subdir/name, else `name` on PATH.
    NOT_FOUND naming every place looked at and how to name the binary otherwise."""
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise PipetrainError(StatusCode.NOT_FOUND,
                             "%s=%r is not an executable file" % (argument, explicit))
    if os.environ.get(env):
        path = os.environ[env]
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
        raise PipetrainError(StatusCode.NOT_FOUND, "$%s (%s) is not an executable file"
                             % (env, path))
    looked = []
    if build_dir:
        path = os.path.join(build_dir, subdir, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
        looked.append(path)
    path = shutil.which(name)
    if path:
        return path
    looked.append("%s on PATH" % name)
    raise PipetrainError(StatusCode.NOT_FOUND,
                         "cannot find the %s binary (looked at %s): pass %s=, set $%s, or pass "
                         "build_dir= the CMake build directory (build after scripts/build.sh, "
                         "build-demo after scripts/demo.sh)"
                         % (name, ", ".join(looked), argument, env))


def _read_line(stream, timeout_s):
    """The first line on `stream` within timeout_s, or what came before the time ran out."""
    selector = selectors.DefaultSelector()
    selector.register(stream, selectors.EVENT_READ)
    line = b""
    deadline = time.monotonic() + timeout_s
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not selector.select(left):
            break
        chunk = os.read(stream.fileno(), 1)
        if not chunk:
            break
        line += chunk
    selector.close()
    return line.decode(errors="replace").strip()


def _cpu_lists(worker_cpus, workers):
    """worker_cpus as one --cpus string per worker, or None."""
    if worker_cpus is None:
        return None
    lists = []
    try:
        for item in worker_cpus:
            if isinstance(item, str):
                lists.append(item)
            else:
                lists.append(",".join(str(int(c)) for c in item))
    except (TypeError, ValueError):
        lists = None
    if lists is None or len(lists) != workers or any(not item for item in lists):
        raise PipetrainError(StatusCode.INVALID_ARGUMENT,
                             "worker_cpus needs one non-empty CPU list per worker (%d), got %r"
                             % (workers, worker_cpus))
    return lists


def _invalid(message):
    return PipetrainError(StatusCode.INVALID_ARGUMENT, message)


def _worker_count(workers, stages, replicas):
    """The workers LocalCluster starts: stages x replicas if `stages` is given, else `workers`."""
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        raise _invalid("replicas must be an integer >= 1, got %r" % (replicas,))
    if stages is None:
        if replicas != 1:
            raise _invalid("replicas=%d needs stages= (the cluster starts stages x replicas "
                           "workers)" % replicas)
        return workers
    if not isinstance(stages, int) or isinstance(stages, bool) or stages < 1:
        raise _invalid("stages must be an integer >= 1, got %r" % (stages,))
    return stages * replicas


class LocalCluster:
    """Starts a coordinator (--listen 127.0.0.1:0, checkpoints under `checkpoint_root`, default a
    directory in `log_dir`) and `workers` stage workers named w0, w1, ... and waits (at most
    `start_timeout` s) until all registered. Logs go to `log_dir` (default: a new temporary
    directory, removed by stop() unless a daemon failed). `worker_cpus`: one CPU list per worker
    (a string like "0-3" or a list of ints), passed as its --cpus, so that each worker runs on
    CPUs of its own as `pipetrain local` runs its workers; None (the default): they float.
    Binaries: see _find_binary (arguments, $PIPETRAIN_COORDINATOR_BINARY /
    $PIPETRAIN_STAGE_WORKER_BINARY, `build_dir`, PATH). stop() (or leaving the `with`
    block) sends SIGTERM to each daemon by PID and waits for it. Raises PipetrainError:
    NOT_FOUND for a missing binary, UNAVAILABLE for a daemon that did not start, naming its log,
    INVALID_ARGUMENT for a worker_cpus that does not give one list per worker.

    `stages` and `replicas` (keywords): the shape of the job the cluster is for; given `stages`,
    the cluster starts stages x replicas workers (a job of `replicas` data-parallel copies of a
    `stages`-stage pipeline, create_job(stages=..., replicas=...)) instead of `workers`.
    INVALID_ARGUMENT for counts < 1, or `replicas` without `stages`."""

    def __init__(self, workers=2, coordinator_binary=None, worker_binary=None, build_dir=None,
                 log_dir=None, checkpoint_root=None, start_timeout=30.0, worker_cpus=None, *,
                 stages=None, replicas=1):
        workers = _worker_count(workers, stages, replicas)
        cpus = _cpu_lists(worker_cpus, workers)
        coordinator = _find_binary("coordinator", coordinator_binary, COORDINATOR_BINARY_ENV,
                                   build_dir, "server/coordinator", "coordinator_binary")
        worker = _find_binary("stage_worker", worker_binary, STAGE_WORKER_BINARY_ENV, build_dir,
                              "server/worker", "worker_binary")
        self._own_log_dir = log_dir is None
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="pipetrain-local-")
        self.checkpoint_root = checkpoint_root or os.path.join(self.log_dir, "checkpoints")
        os.makedirs(self.checkpoint_root, exist_ok=True)
        self._processes = []
        self._workers = {}  # name -> Popen
        self._logs = []
        self.address = None
        try:
            self._start(coordinator, worker, workers, start_timeout, cpus)
        except BaseException:
            self.stop(keep_logs=True)
            raise

    def _log(self, name):
        f = open(os.path.join(self.log_dir, name), "wb")
        self._logs.append(f)
        return f

    def _start(self, coordinator, worker, workers, start_timeout, cpus):
        process = subprocess.Popen(
            [coordinator, "--listen", "127.0.0.1:0", "--checkpoint-root", self.checkpoint_root],
            stdout=subprocess.PIPE, stderr=self._log("coordinator.log"))
        self._processes.append(process)
        # It prints "coordinator listening on HOST:PORT" once it serves.
        line = _read_line(process.stdout, start_timeout)
        prefix = "coordinator listening on "
        if not line.startswith(prefix):
            raise PipetrainError(StatusCode.UNAVAILABLE,
                                 "the coordinator did not start (%r); see %s/coordinator.log"
                                 % (line, self.log_dir))
        self.address = line[len(prefix):]
        for w in range(workers):
            log = self._log("worker-%d.log" % w)
            argv = [worker, "--coordinator", self.address, "--listen", "127.0.0.1:0", "--name",
                    "w%d" % w]
            if cpus is not None:
                argv += ["--cpus", cpus[w]]
            process = subprocess.Popen(argv, stdout=log, stderr=log)
            self._processes.append(process)
            self._workers["w%d" % w] = process
        from pipetrain.client import Client
        with Client(self.address, connect_timeout=start_timeout) as client:
            deadline = time.monotonic() + start_timeout
            while len(client.workers()) < workers:  # each measures its GFLOP/s first
                if time.monotonic() > deadline:
                    raise PipetrainError(StatusCode.UNAVAILABLE,
                                         "the workers did not register within %gs; see %s"
                                         % (start_timeout, self.log_dir))
                time.sleep(0.01)

    def worker_pid(self, name):
        """The process id of the worker named `name` (w0, w1, ...), for tests that signal it.
        NOT_FOUND for a name this cluster did not start."""
        if name in self._workers:
            return self._workers[name].pid
        raise PipetrainError(StatusCode.NOT_FOUND, "no worker named %r in this cluster" % (name,))

    def wait_worker(self, name, timeout=10.0):
        """Waits (at most `timeout` s) for the worker named `name` to exit; returns its exit
        status (negative: the signal that ended it) or None if it still runs."""
        try:
            return self._workers[name].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.stop(keep_logs=exc_type is not None)
        return False

    def stop(self, keep_logs=False):
        """Stops every daemon (SIGTERM by PID, SIGKILL after 20 s) and removes the temporary log
        directory unless keep_logs. Idempotent."""
        for p in self._processes:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self._processes:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
            if p.stdout is not None:
                p.stdout.close()
        self._processes = []
        self._workers = {}
        for f in self._logs:
            f.close()
        self._logs = []
        if self._own_log_dir and not keep_logs and os.path.isdir(self.log_dir):
            shutil.rmtree(self.log_dir, ignore_errors=True)
