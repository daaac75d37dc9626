"""The Python client against a real coordinator and two stage workers on 127.0.0.1."""

import json
import os
import subprocess
from concurrent import futures

import grpc
import numpy as np
import pytest

import pipetrain
from pipetrain import StatusCode, data
from pipetrain.v1 import coordinator_pb2 as pb
from pipetrain.v1 import coordinator_pb2_grpc

STEPS = 12
BATCH = 64
SEED = 1
OPTIMIZER = "adamw:lr=1e-2"

# examples/mlp_digits.textproto with every size left to the data set.
UNRESOLVED_MLP = """
  name: "mlp_digits"
  layers { linear { out_features: 128 } }
  layers { relu {} }
  layers { linear { out_features: 128 } }
  layers { relu {} }
  layers { linear { out_features: 0 } }
  loss { softmax_cross_entropy {} }
"""


def bits(values):
    return np.asarray(values, dtype=np.float32).view(np.uint32).tolist()


def cli_losses(daemons, model, schedule, microbatches, extra_flags=()):
    """Per-step losses of `pipetrain train` against the daemons (its --json lines), with
    `extra_flags` added to its command line."""
    run = subprocess.run(
        [os.environ["PIPETRAIN_BINARY"], "train", "--coordinator", daemons.address, "--stages",
         "2", "--schedule", schedule, "--model", model, "--data", "digits", "--steps", str(STEPS),
         "--batch", str(BATCH), "--microbatches", str(microbatches), "--seed", str(SEED),
         "--optimizer", OPTIMIZER, "--json", *extra_flags],
        capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    steps = [line for line in lines if "step" in line]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    return [s["loss"] for s in steps]


@pytest.mark.parametrize("schedule,microbatches", [("1f1b", 4), ("zb-v", 8)])
def test_losses_equal_pipetrain_train_bit_for_bit(daemons, example, schedule, microbatches):
    model = example("mlp_digits.textproto")
    expected = cli_losses(daemons, model, schedule, microbatches)
    digits = data.load("digits")
    # The spec as written in the example, and the same model with its sizes left to the
    # coordinator (resolved from the data shape): both train the CLI's losses.
    for spec in (model, UNRESOLVED_MLP):
        with daemons.client.create_job(model=spec, schedule=schedule, stages=2,
                                       microbatches=microbatches, optimizer=OPTIMIZER, seed=SEED,
                                       data=digits) as job:
            results = list(job.train(data.batches(digits, BATCH, seed=SEED), steps=STEPS,
                                     progress=False))
        assert [r.step for r in results] == list(range(1, STEPS + 1))
        assert bits([r.loss for r in results]) == bits(expected)
        for r in results:
            assert len(r.microbatch_losses) == microbatches
            total = np.float32(0)
            for x in r.microbatch_losses:  # float sum in increasing micro-batch order
                total = np.float32(total + np.float32(x))
            assert bits([total]) == bits([r.loss])
            assert 0.0 <= r.bubble_fraction <= 1.0 and r.step_ms > 0
            assert [w.rank for w in r.workers] == [0, 1]
        assert job.status().state == pb.JOB_STATE_DONE
    assert expected[-1] < expected[0]  # it learns
    assert sorted(daemons.idle_workers()) == ["w0", "w1"]


def test_send_ahead_trains_the_same_losses_as_pipetrain_train(daemons, example):
    model = example("mlp_digits.textproto")
    expected = cli_losses(daemons, model, "1f1b", 4)
    digits = data.load("digits")
    batches = data.batches(digits, BATCH, seed=SEED)
    results = []
    with daemons.client.create_job(model=model, schedule="1f1b", stages=2, microbatches=4,
                                   optimizer=OPTIMIZER, seed=SEED, data=digits) as job:
        # Two batches in flight: batch k+1 is sent before result k is received.
        for _ in range(2):
            job.send(*next(batches)[:2])
        assert job.in_flight == 2
        with pytest.raises(pipetrain.PipetrainError) as e:
            job.send(*next(iter(data.batches(digits, BATCH, seed=SEED)))[:2])
        assert e.value.code == StatusCode.FAILED_PRECONDITION
        for n in range(STEPS):
            results.append(job.receive())
            if n + 2 < STEPS:
                job.send(*next(batches)[:2])
        assert job.in_flight == 0
    assert [r.step for r in results] == list(range(1, STEPS + 1))
    assert bits([r.loss for r in results]) == bits(expected)


# Warm-up over 3 updates, then a cosine decay to 1e-3 at update 10, then 1e-3 (steps 11 and 12).
LR_FLAGS = ["--lr-schedule", "warmup-cosine", "--warmup-steps", "3", "--lr-decay-steps", "10",
            "--lr-min", "1e-3"]


def test_lr_schedule_losses_equal_pipetrain_train_bit_for_bit(daemons, example):
    model = example("mlp_digits.textproto")
    expected = cli_losses(daemons, model, "1f1b", 4, LR_FLAGS)
    constant = cli_losses(daemons, model, "1f1b", 4)
    # The schedule changes every update: the first loss (before any update) is the same, every
    # later one differs from the constant rate's.
    assert bits(expected[:1]) == bits(constant[:1])
    assert all(a != b for a, b in zip(bits(expected[1:]), bits(constant[1:])))
    digits = data.load("digits")
    # The same schedule as the create_job argument (a dict, text, an LrScheduleSpec) and as the
    # optimizer text's keys (`pipetrain --optimizer`'s).
    schedule = {"kind": "warmup-cosine", "warmup_steps": 3, "decay_steps": 10, "min_lr": 1e-3}
    for optimizer, lr_schedule in (
            (OPTIMIZER, schedule),
            (OPTIMIZER, "warmup-cosine:warmup_steps=3,lr_decay_steps=10,lr_min=1e-3"),
            (OPTIMIZER, pipetrain.lr_schedule_spec(schedule)),
            (OPTIMIZER + ",lr_schedule=warmup-cosine,warmup_steps=3,decay_steps=10,lr_min=1e-3",
             None)):
        with daemons.client.create_job(model=model, schedule="1f1b", stages=2, microbatches=4,
                                       optimizer=optimizer, seed=SEED, data=digits,
                                       lr_schedule=lr_schedule) as job:
            results = list(job.train(data.batches(digits, BATCH, seed=SEED), steps=STEPS,
                                     progress=False))
        assert bits([r.loss for r in results]) == bits(expected), (optimizer, lr_schedule)
    assert sorted(daemons.idle_workers()) == ["w0", "w1"]


def test_isa_runs_the_job_at_that_level_as_pipetrain_train_does(daemons, example):
    model = example("mlp_digits.textproto")
    digits = data.load("digits")
    with daemons.client.create_job(model=model, stages=2, microbatches=4, optimizer=OPTIMIZER,
                                   seed=SEED, data=digits) as job:
        level = job.status().spec.isa  # the highest level both workers run.
    assert level
    expected = cli_losses(daemons, model, "1f1b", 4, ["--isa", level])
    with daemons.client.create_job(model=model, schedule="1f1b", stages=2, microbatches=4,
                                   optimizer=OPTIMIZER, seed=SEED, data=digits, isa=level) as job:
        assert job.status().spec.isa == level
        results = list(job.train(data.batches(digits, BATCH, seed=SEED), steps=STEPS,
                                 progress=False))
    assert bits([r.loss for r in results]) == bits(expected)
    for bad in ("x86-64-v9", 4):
        with pytest.raises(pipetrain.PipetrainError) as e:
            daemons.client.create_job(model=model, stages=2, isa=bad)
        assert e.value.code == StatusCode.INVALID_ARGUMENT and "isa" in e.value.message, bad
    assert sorted(daemons.idle_workers()) == ["w0", "w1"]


def test_bad_lr_schedule_raises_invalid_argument(daemons, example):
    model = example("mlp_digits.textproto")
    for bad, says in (({"kind": "warmup-cosine", "warmup_steps": 3}, "decay_steps is required"),
                      ({"kind": "cosine", "decay_steps": 3}, "unknown kind 'cosine'"),
                      ({"warmup": 3}, "unknown key 'warmup'"),
                      ("warmup-linear:decay_steps=2.5", "decay_steps must be an integer, got '2.5'")):
        with pytest.raises(pipetrain.PipetrainError) as e:
            daemons.client.create_job(model=model, stages=2, lr_schedule=bad)
        assert e.value.code == StatusCode.INVALID_ARGUMENT and says in e.value.message, bad
    # Ranges are the coordinator's to check: min_lr above lr.
    with pytest.raises(pipetrain.PipetrainError) as e:
        daemons.client.create_job(model=model, stages=2, optimizer=OPTIMIZER,
                                  lr_schedule={"kind": "warmup-linear", "decay_steps": 10,
                                               "min_lr": 1.0})
    assert e.value.code == StatusCode.INVALID_ARGUMENT and e.value.method == "CreateJob"
    assert sorted(daemons.idle_workers()) == ["w0", "w1"]


def test_bad_spec_raises_invalid_argument_with_the_coordinators_message(daemons, example):
    model = example("mlp_digits.textproto")
    with pytest.raises(pipetrain.PipetrainError) as e:
        daemons.client.create_job(model=model, schedule="pipedream", stages=2)
    assert e.value.code == StatusCode.INVALID_ARGUMENT
    assert "pipedream" in e.value.message and e.value.method == "CreateJob"
    with pytest.raises(pipetrain.PipetrainError) as e:
        daemons.client.create_job(model=model, stages=2, optimizer={"kind": "adamw", "lr": 0})
    assert e.value.code == StatusCode.INVALID_ARGUMENT and "lr" in e.value.message
    # Sizes left 0 without a data shape: the message says where they come from.
    with pytest.raises(pipetrain.PipetrainError) as e:
        daemons.client.create_job(model=UNRESOLVED_MLP, stages=2)
    assert e.value.code == StatusCode.INVALID_ARGUMENT
    assert "JobSpec.data_shape" in e.value.message
    with pytest.raises(pipetrain.PipetrainError) as e:
        daemons.client.create_job(model="layers { linear { out_features: } }")
    assert e.value.code == StatusCode.INVALID_ARGUMENT and "model text" in e.value.message
    assert sorted(daemons.idle_workers()) == ["w0", "w1"]


def test_bad_batch_ends_the_step_and_the_job_trains_on(daemons, example):
    digits = data.load("digits")
    inputs, targets = next(data.BatchSampler(digits, BATCH, seed=SEED))
    with daemons.client.create_job(model=example("mlp_digits.textproto"), stages=2,
                                   microbatches=4, optimizer=OPTIMIZER, seed=SEED) as job:
        with pytest.raises(pipetrain.PipetrainError) as e:
            job.step(inputs[:63], targets[:63])
        assert e.value.code == StatusCode.INVALID_ARGUMENT and e.value.method == "Train"
        assert "not divisible by the job's 4 micro-batches" in e.value.message
        bad = targets.copy()
        bad[5] = 10  # class 10 of 10
        with pytest.raises(pipetrain.PipetrainError) as e:
            job.step(inputs, bad)
        assert e.value.code == StatusCode.INVALID_ARGUMENT
        # Integer labels as a vector, PyTorch style: converted to float32 rows.
        r = job.step(inputs.astype(np.float64), targets.ravel().astype(np.int64))
        assert r.step == 1
        assert job.status().steps_done == 1


def test_cancel_ends_the_job_and_frees_its_workers(daemons, example):
    job = daemons.client.create_job(model=example("mlp_digits.textproto"), stages=2,
                                    microbatches=2, seed=SEED)
    assert daemons.idle_workers() == []
    digits = data.load("digits")
    inputs, targets = next(data.BatchSampler(digits, 16, seed=SEED))
    job.step(inputs, targets)
    status = job.cancel("test says stop")
    assert status.state == pb.JOB_STATE_CANCELLED and status.reason == "test says stop"
    assert sorted(daemons.idle_workers()) == ["w0", "w1"]
    with pytest.raises(pipetrain.PipetrainError) as e:
        job.step(inputs, targets)
    assert e.value.code == StatusCode.FAILED_PRECONDITION
    # Cancelling again is OK and changes nothing.
    assert job.cancel().state == pb.JOB_STATE_CANCELLED


def test_watch_yields_the_status_the_steps_and_the_end(daemons, example):
    digits = data.load("digits")
    with daemons.client.create_job(model=example("mlp_digits.textproto"), stages=2,
                                   microbatches=2, seed=SEED, planned_steps=5) as job:
        results = list(job.train(data.batches(digits, 16, seed=SEED), steps=3, progress=False))
        progress = job.status().progress
        assert (progress.step, progress.target_step) == (3, 5)
        assert progress.loss == results[-1].loss and progress.HasField("eta_seconds")
        job.finish()
    events = list(daemons.client.watch(job.id))
    assert events[0].WhichOneof("kind") == "status" and events[0].status.job == job.id
    steps = [e.step for e in events if e.WhichOneof("kind") == "step"]
    assert [s.step for s in steps] == [1, 2, 3]
    assert bits([s.loss for s in steps]) == bits([r.loss for r in results])
    assert events[-1].ended.state == pb.JOB_STATE_DONE and events[-1].ended.steps_done == 3
    with pytest.raises(pipetrain.PipetrainError) as e:
        list(daemons.client.watch("job-none-1"))
    assert e.value.code == StatusCode.NOT_FOUND


def test_context_manager_cancels_on_an_exception_and_frees_the_workers(daemons, example):
    digits = data.load("digits")
    with pytest.raises(RuntimeError):
        with daemons.client.create_job(model=example("mlp_digits.textproto"), stages=2,
                                       microbatches=2, seed=SEED) as job:
            inputs, targets = next(data.BatchSampler(digits, 16, seed=SEED))
            job.step(inputs, targets)
            raise RuntimeError("user code failed")
    status = daemons.client.job(job.id).status()
    assert status.state == pb.JOB_STATE_CANCELLED
    assert "RuntimeError: user code failed" in status.reason
    assert status.steps_done == 1
    assert sorted(daemons.idle_workers()) == ["w0", "w1"]


def test_checkpoint_writes_the_state_on_the_coordinators_host(daemons, example):
    digits = data.load("digits")
    directory = os.path.join(daemons.checkpoint_root, "python-ckpt")
    with daemons.client.create_job(model=example("mlp_digits.textproto"), stages=2,
                                   microbatches=2, seed=SEED) as job:
        for _ in job.train(data.batches(digits, 16, seed=SEED), steps=3, progress=False):
            pass
        response = job.checkpoint(directory)
    assert response.step == 3 and response.directory == directory
    with open(os.path.join(directory, "manifest.json"), encoding="utf-8") as f:
        assert json.load(f)["step"] == 3
    with pytest.raises(pipetrain.PipetrainError) as e:
        daemons.client.job(job.id).checkpoint("/")  # outside the checkpoint root, and job ended
    assert e.value.code in (StatusCode.PERMISSION_DENIED, StatusCode.FAILED_PRECONDITION)


def test_evaluate_gives_pipetrain_evaluates_figures_on_the_live_weights(daemons, example):
    digits = data.load("digits")
    held_out = 300  # two chunks of 256 and 44 samples
    x, y = digits.samples("eval", np.arange(held_out))
    directory = os.path.join(daemons.checkpoint_root, "python-eval")
    with daemons.client.create_job(model=example("mlp_digits.textproto"), stages=2,
                                   microbatches=2, seed=SEED, optimizer=OPTIMIZER) as job:
        for _ in job.train(data.batches(digits, 16, seed=SEED), steps=3, progress=False):
            pass
        result = job.evaluate(x, y)
        job.checkpoint(directory)
        again = job.evaluate(x, y, chunk_samples=50)
        with pytest.raises(pipetrain.PipetrainError) as e:
            job.evaluate(x, y, chunk_samples=-1)
        assert e.value.code == StatusCode.INVALID_ARGUMENT
    assert result.step == 3 and result.samples == held_out and result.chunk_samples == 256
    assert [c.samples for c in result.chunks] == [256, 44]
    # Other chunks, the same model: the figures differ at most in the last bits of the sum.
    assert len(again.chunks) == 6 and again.correct == result.correct
    run = subprocess.run(
        [os.environ["PIPETRAIN_BINARY"], "evaluate", "--resume", directory, "--eval-samples",
         str(held_out), "--data", "digits", "--json"],
        capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    expected = json.loads(run.stdout.splitlines()[-1])
    assert "%.9g" % result.loss == "%.9g" % expected["eval_loss"]
    assert "%.9g" % result.accuracy == "%.9g" % expected["eval_accuracy"]


def test_save_to_is_checked_when_the_job_is_created(daemons, example):
    """A save directory outside the checkpoint root is refused before the job takes a worker."""
    with pytest.raises(pipetrain.PipetrainError) as e:
        daemons.client.create_job(model=example("mlp_digits.textproto"), stages=2,
                                  microbatches=2, seed=SEED, save_to="/etc/pipetrain-python-ck")
    assert e.value.code == StatusCode.PERMISSION_DENIED
    assert "'/etc/pipetrain-python-ck' is outside the checkpoint root" in e.value.message
    assert sorted(daemons.idle_workers()) == ["w0", "w1"]
    assert not os.path.exists("/etc/pipetrain-python-ck")


def test_a_failed_checkpoint_keeps_the_job_for_a_retry(daemons, example):
    """A `with` block left by a failed checkpoint's error leaves the job with its weights (a note
    on the error says how to save them); a retry saves them, then the job is finished."""
    digits = data.load("digits")
    runs = os.path.join(daemons.checkpoint_root, "python-runs")
    directory = os.path.join(runs, "ck")
    with pytest.raises(pipetrain.PipetrainError) as e:
        with daemons.client.create_job(model=example("mlp_digits.textproto"), stages=2,
                                       microbatches=2, seed=SEED, save_to=directory,
                                       keep_checkpoints=2) as job:
            assert job.spec.save_to == directory
            for _ in job.train(data.batches(digits, 16, seed=SEED), steps=3, progress=False):
                pass
            os.rmdir(runs)
            with open(runs, "w", encoding="utf-8") as f:  # the directory is gone: a file there
                f.write("not a directory")
            job.checkpoint(directory, keep=2,
                           data_position={"data": "digits", "batch_size": 16})
    assert job.failed_checkpoint == directory
    assert any("pipetrain checkpoint %s --save %s" % (job.id, directory) in note
               for note in getattr(e.value, "__notes__", []))
    status = daemons.client.job(job.id).status()
    assert status.state == pb.JOB_STATE_READY and status.steps_done == 3
    os.remove(runs)
    response = job.checkpoint(directory, keep=2)
    assert response.step == 3 and response.data_position.data == "digits"
    assert job.failed_checkpoint is None
    assert job.finish().state == pb.JOB_STATE_DONE
    with open(os.path.join(directory, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    assert manifest["step"] == 3 and manifest["data"] == "digits" and manifest["batch_size"] == 16
    assert sorted(daemons.idle_workers()) == ["w0", "w1"]


def test_torch_tensors_are_accepted(daemons, example):
    torch = pytest.importorskip("torch")
    digits = data.load("digits")
    inputs, targets = next(data.BatchSampler(digits, 16, seed=SEED))
    with daemons.client.create_job(model=example("mlp_digits.textproto"), stages=2,
                                   microbatches=2, seed=SEED) as job:
        r = job.step(torch.from_numpy(inputs), torch.from_numpy(targets.ravel()).long())
    assert r.step == 1


class _RecordingCoordinator(coordinator_pb2_grpc.CoordinatorServicer):
    def __init__(self):
        self.metadata = []

    def ListJobs(self, request, context):
        self.metadata.append(dict(context.invocation_metadata()))
        return pb.ListJobsResponse()


def test_token_travels_as_bearer_metadata_from_the_argument_or_the_environment(monkeypatch):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = _RecordingCoordinator()
    coordinator_pb2_grpc.add_CoordinatorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        address = "127.0.0.1:%d" % port
        monkeypatch.delenv("PIPETRAIN_TOKEN", raising=False)
        with pipetrain.Client(address) as client:
            client.jobs()
        with pipetrain.Client(address, token="s3cret") as client:
            client.jobs()
        monkeypatch.setenv("PIPETRAIN_TOKEN", "from-env")
        with pipetrain.Client(address) as client:
            client.jobs()
    finally:
        server.stop(None)
    assert "authorization" not in servicer.metadata[0]
    assert servicer.metadata[1]["authorization"] == "Bearer s3cret"
    assert servicer.metadata[2]["authorization"] == "Bearer from-env"


def test_unreachable_coordinator_is_unavailable():
    # A port nobody listens on: bind one, close it.
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(pipetrain.PipetrainError) as e:
        pipetrain.Client("127.0.0.1:%d" % port, connect_timeout=1)
    assert e.value.code == StatusCode.UNAVAILABLE and "cannot reach" in e.value.message


def test_a_model_path_that_does_not_exist_says_the_file_is_missing(daemons, tmp_path):
    missing = os.path.join("examples", "no_such_model.textproto")
    with pytest.raises(pipetrain.PipetrainError) as e:
        pipetrain.model_spec(missing)
    assert e.value.code == StatusCode.NOT_FOUND
    assert e.value.message.startswith("model file %s does not exist (relative to the current "
                                      "directory %s)" % (missing, os.getcwd())), e.value.message
    # create_job says the same before it asks the coordinator anything.
    with pytest.raises(pipetrain.PipetrainError) as e:
        daemons.client.create_job(model=str(tmp_path / "gone.textproto"), stages=2)
    assert e.value.code == StatusCode.NOT_FOUND and e.value.method == ""
    assert e.value.message.startswith("model file %s does not exist:" % (tmp_path / "gone.textproto"))
    assert "has no field named" not in e.value.message
    # A directory is no model file; text is still text.
    with pytest.raises(pipetrain.PipetrainError) as e:
        pipetrain.model_spec(str(tmp_path))
    assert e.value.code == StatusCode.INVALID_ARGUMENT and "not a regular file" in e.value.message
    spec = pipetrain.model_spec("input_features: 4 layers { linear { out_features: 2 } }")
    assert spec.input_features == 4 and len(spec.layers) == 1
    assert sorted(daemons.idle_workers()) == ["w0", "w1"]


def test_generate_on_the_live_job_gives_pipetrain_generates_text(daemons, example):
    """job.generate() (the Generate RPC, several prompts decoded together) and
    pipetrain.generate() of the live job give exactly the text pipetrain.generate() gives for a
    checkpoint of the same weights with the same seed."""
    model = example("gpt_char.textproto")
    context = pipetrain.model_spec(model).layers[0].embedding.context
    text = data.load("text", context=context)
    vocabulary = text.vocabulary
    directory = os.path.join(daemons.checkpoint_root, "python-generate")
    prompts = ["The ", "of the"]
    ids = [[vocabulary.index(c) for c in p.encode()] for p in prompts]
    options = dict(max_tokens=30, temperature=0.8, top_k=5, seed=11)
    with daemons.client.create_job(model=model, stages=2, microbatches=2, seed=SEED,
                                   optimizer=OPTIMIZER, data=text) as job:
        for _ in job.train(data.batches(text, 8, seed=SEED), steps=2, progress=False):
            pass
        job.checkpoint(directory)
        result = job.generate(ids, **options)
        remote = pipetrain.generate(prompts[1], coordinator=daemons.client.address, job=job.id,
                                    data="text", **options)
        with pytest.raises(pipetrain.PipetrainError) as e:
            job.generate([[len(vocabulary)]], **options)
        assert e.value.code == StatusCode.INVALID_ARGUMENT
    assert result.step == 2 and len(result.sequences) == 2
    for prompt, sequence in zip(prompts, result.sequences):
        local = pipetrain.generate(prompt, checkpoint=directory, data="text", **options)
        assert local == prompt + bytes(vocabulary[t] for t in sequence.tokens).decode("latin-1")
    assert remote == pipetrain.generate(prompts[1], checkpoint=directory, data="text", **options)
    with pytest.raises(pipetrain.PipetrainError) as e:
        pipetrain.generate("x")
    assert e.value.code == StatusCode.INVALID_ARGUMENT
