"""pipetrain.data reproduces the CLI's data sets and batch order (common/io/dataset.cc)."""

import numpy as np
import pytest

import pipetrain
from pipetrain import StatusCode, data


def test_mt19937_64_is_the_standards():
    gen = data.MT19937_64()  # default seed 5489
    for _ in range(9999):
        gen()
    assert gen() == 9981545732273789042  # [rand.predef] of the C++ standard


def test_epoch_permutation_is_the_pinned_cpp_order():
    # tests/common/io/dataset_test.cc pins the same values for BatchSampler::EpochPermutation.
    assert data.epoch_permutation(8, 0, 0) == [6, 7, 0, 2, 3, 1, 5, 4]
    p = data.epoch_permutation(1000, 5, 0)
    assert sorted(p) == list(range(1000)) and p != list(range(1000))
    assert p != data.epoch_permutation(1000, 5, 1)


def test_digits_split_and_scaling():
    digits = data.load("digits")
    assert (digits.size("train"), digits.size("eval")) == (1438, 359)
    assert digits.shape == {"input_features": 64, "target_features": 1, "num_classes": 10,
                            "tokens_per_sample": 1}
    x, y = digits.samples("train", [0, 4])
    assert x.dtype == np.float32 and x.shape == (2, 64) and y.shape == (2, 1)
    # Train sample 4 is row 5 (row 4 is held out); pixels are counts / 16 in [0, 1].
    ex, ey = data.eval_batch(digits, 0, 1)
    assert ex.shape == (1, 64)
    assert float(x.max()) <= 1.0 and np.all(x * 16 == np.round(x * 16))


def test_batches_follow_the_permutation_and_drop_the_remainder():
    digits = data.load("digits")
    sampler = data.BatchSampler(digits, 500, seed=3)
    assert sampler.batches_per_epoch == 2
    perm = data.epoch_permutation(1438, 3, 0)
    first, _ = next(sampler)
    expected, _ = digits.samples("train", perm[:500])
    assert np.array_equal(first, expected)
    next(sampler)
    assert sampler.cursor == (1, 0)
    again = data.BatchSampler(digits, 500, seed=3, cursor=(0, 1))
    assert np.array_equal(next(again)[0], digits.samples("train", perm[500:1000])[0])


def test_text_windows_and_vocabulary():
    text = data.load("text", context=32)
    assert text.num_classes == 76 and text.vocabulary[:2] == b"\n "
    x, y = text.samples("train", [0])
    assert x.shape == (32, 1) and np.array_equal(x[1:], y[:-1])


def test_bad_specs_are_invalid_argument():
    for spec, kwargs in (("npy:a,b,c", {}), ("digits:x", {}), ("text", {}), ("parquet:x", {})):
        with pytest.raises(pipetrain.PipetrainError) as e:
            data.load(spec, **kwargs)
        assert e.value.code == StatusCode.INVALID_ARGUMENT
    with pytest.raises(pipetrain.PipetrainError) as e:
        data.BatchSampler(data.load("digits"), 2000)
    assert e.value.code == StatusCode.INVALID_ARGUMENT and "1438" in e.value.message


def test_load_for_model_takes_what_create_job_takes(example):
    path = example("gpt_char.textproto")
    from_path = data.load_for_model("text", path)
    assert from_path.tokens_per_sample == 32 and from_path.num_classes == 76
    with open(path) as f:
        text = f.read()
    assert data.load_for_model("text", text).tokens_per_sample == 32
    assert data.load_for_model("text", pipetrain.model_spec(path)).tokens_per_sample == 32
    assert data.load_for_model("digits", example("mlp_digits.textproto")).input_features == 64


def test_load_for_model_refuses_text_for_a_model_without_an_embedding(example):
    with pytest.raises(pipetrain.PipetrainError) as e:
        data.load_for_model("text", example("mlp_digits.textproto"))
    assert e.value.code == StatusCode.INVALID_ARGUMENT
    assert "the model has none: use a token model (e.g. examples/gpt_char.textproto)" in \
        e.value.message
    with pytest.raises(pipetrain.PipetrainError) as e:
        data.load_for_model("text", "examples/no_such_model.textproto")
    assert e.value.code == StatusCode.NOT_FOUND
