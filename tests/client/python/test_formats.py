"""pipetrain.data reads csv:, npy: and tokens: as the CLI does: the same batches and held-out
samples, bit for bit, as common/io (printed by the dataset_dump tool that CTest names in
$PIPETRAIN_DATASET_DUMP), and the same refusals."""

import os
import subprocess

import numpy as np
import pytest

import pipetrain
from pipetrain import StatusCode, data

DUMP = os.environ.get("PIPETRAIN_DATASET_DUMP", "")
BATCH, SEED, STEPS = 4, 7, 5


def cpp_arrays(spec, context=0, regression_targets=0, vocab_size=0):
    """The C++ side's STEPS batches and its held-out samples, as one float32 array."""
    if not os.path.exists(DUMP):
        pytest.skip("the dataset_dump tool is not built")
    run = subprocess.run([DUMP, spec, str(context), str(regression_targets), str(vocab_size),
                          str(BATCH), str(SEED), str(STEPS)], capture_output=True, timeout=60,
                         check=False)
    assert run.returncode == 0, run.stderr.decode()
    return np.frombuffer(run.stdout, dtype=np.float32)


def python_arrays(dataset):
    parts = []
    for inputs, targets in data.batches(dataset, BATCH, seed=SEED, steps=STEPS):
        parts += [inputs.ravel(), targets.ravel()]
    inputs, targets = data.eval_batch(dataset)
    parts += [inputs.ravel(), targets.ravel()]
    return np.concatenate(parts).astype(np.float32)


def assert_bitwise(dataset, spec, **options):
    expected = cpp_arrays(spec, **options)
    got = python_arrays(dataset)
    assert got.view(np.uint32).tolist() == expected.view(np.uint32).tolist()


def test_npy_classification_and_regression(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((23, 5)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", rng.integers(0, 4, size=23).astype(np.int64))
    np.save(tmp_path / "labels32.npy", rng.integers(0, 3, size=(23, 1)).astype(np.int32))
    np.save(tmp_path / "targets.npy", rng.standard_normal((23, 2)).astype(np.float32))
    spec = "npy:%s" % tmp_path
    d = data.load(spec)
    assert (d.input_features, d.target_features, d.num_classes) == (5, 1, 4)
    assert (d.size("train"), d.size("eval")) == (19, 4)
    assert_bitwise(d, spec)
    spec = "npy:%s/x.npy,%s/labels32.npy" % (tmp_path, tmp_path)
    assert_bitwise(data.load(spec), spec)
    spec = "npy:%s/x.npy,%s/targets.npy" % (tmp_path, tmp_path)
    d = data.load(spec, regression_targets=2)
    assert (d.target_features, d.num_classes) == (2, 0)
    assert_bitwise(d, spec, regression_targets=2)


def test_csv_classification_and_regression(tmp_path):
    rng = np.random.default_rng(4)
    rows = ["a,b,c,t"] + [
        "%s,%s,%s,%s" % (repr(float(rng.standard_normal())), "%.9g" % rng.standard_normal(),
                         "0.1", "%d" % rng.integers(0, 3)) for _ in range(24)]
    # Decimals that are not exact floats, and ties of double rounding: 1 + 2^-24 + 2^-60 rounds
    # up in float32, while float32(float64(x)) rounds it to 1. Row 24 is held out: in the
    # evaluation batch.
    rows.append("1.00000005960464477550,.5,3.,2")
    path = tmp_path / "data.csv"
    path.write_text("\r\n".join(rows) + "\n\n")
    spec = "csv:%s" % path
    d = data.load(spec)
    assert (d.input_features, d.num_classes) == (3, 3)
    assert_bitwise(d, spec)
    d = data.load(spec, regression_targets=2)
    assert (d.input_features, d.target_features) == (2, 2)
    assert_bitwise(d, spec, regression_targets=2)


def test_token_corpus_file_and_nanogpt_directory(tmp_path):
    ids = np.random.default_rng(5).integers(0, 300, size=200).astype(np.uint16)
    ids.tofile(tmp_path / "corpus.bin")
    spec = "tokens:%s" % (tmp_path / "corpus.bin")
    d = data.load(spec, context=6)
    assert (d.tokens_per_sample, d.num_classes) == (6, int(ids.max()) + 1)
    assert (d.size("train"), d.size("eval")) == (180 - 6, 20 - 6)
    assert_bitwise(d, spec, context=6)
    (tmp_path / "nano").mkdir()
    np.arange(70000, 70100, dtype=np.uint32).tofile(tmp_path / "nano" / "train.bin")
    np.arange(50, dtype=np.uint32).tofile(tmp_path / "nano" / "val.bin")
    spec = "tokens:%s:uint32" % (tmp_path / "nano")
    d = data.load(spec, context=3, vocab_size=70100)
    assert d.num_classes == 70100
    assert_bitwise(d, spec, context=3, vocab_size=70100)


@pytest.mark.parametrize("make,spec,kwargs,code,message", [
    (lambda p: np.save(p / "x.npy", np.ones((3, 2), dtype=np.float64)), "npy:{p}/x.npy,{p}/x.npy",
     {}, StatusCode.INVALID_ARGUMENT, "features must be float32"),
    (lambda p: (np.save(p / "x.npy", np.ones((3, 2), dtype=np.float32)),
                np.save(p / "y.npy", np.ones(3, dtype=np.float32))), "npy:{p}", {},
     StatusCode.INVALID_ARGUMENT, "must be int64 or int32, found float32"),
    (lambda p: (np.save(p / "x.npy", np.asfortranarray(np.ones((3, 2), dtype=np.float32))),
                np.save(p / "y.npy", np.ones(3, dtype=np.int64))), "npy:{p}", {},
     StatusCode.INVALID_ARGUMENT, "fortran_order is True"),
    (lambda p: (np.save(p / "x.npy", np.ones((3, 2), dtype=">f4")),
                np.save(p / "y.npy", np.ones(3, dtype=np.int64))), "npy:{p}", {},
     StatusCode.INVALID_ARGUMENT, "is big-endian"),
    (lambda p: None, "npy:{p}/a,b,c", {}, StatusCode.INVALID_ARGUMENT, "use the directory form"),
    (lambda p: (p / "t.bin").write_bytes(b"\x01\x00" * 40 + b"\x09"), "tokens:{p}/t.bin",
     {"context": 2}, StatusCode.INVALID_ARGUMENT, "81 bytes is not a whole number"),
    (lambda p: np.arange(40, dtype=np.uint16).tofile(p / "t.bin"), "tokens:{p}/t.bin",
     {"context": 2, "vocab_size": 30}, StatusCode.INVALID_ARGUMENT,
     "token id 30 at token 30 (byte 60) is not below 30"),
    (lambda p: (p / "r.csv").write_text("1,2,0.5\n"), "csv:{p}/r.csv", {},
     StatusCode.INVALID_ARGUMENT, "r.csv:1:3: class label '0.5' is not an integer"),
    (lambda p: (p / "r.csv").write_text("1,2,nan\n"), "csv:{p}/r.csv", {"regression_targets": 1},
     StatusCode.INVALID_ARGUMENT, "r.csv:1:3: target 'nan' is not a finite number"),
    (lambda p: None, "csv:{p}/missing.csv", {}, StatusCode.NOT_FOUND, "missing.csv"),
])
def test_refusals_match_the_cli(tmp_path, make, spec, kwargs, code, message):
    make(tmp_path)
    with pytest.raises(pipetrain.PipetrainError) as e:
        data.load(spec.format(p=tmp_path), **kwargs)
    assert e.value.code == code
    assert message in e.value.message
