"""pipetrain.tokenizer and data.load(..., tokenizer=) give the very token ids of the C++ side
(`pipetrain tokenizer encode`, common/io/token_text_dataset.cc), and a job trained on them
carries the tokenizer into its checkpoints."""

import json
import os
import subprocess

import numpy as np
import pytest

import pipetrain
from pipetrain import StatusCode, data, tokenizer

SOURCE_DIR = os.environ.get(
    "PIPETRAIN_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
BINARY = os.environ.get("PIPETRAIN_BINARY", "pipetrain")
TEXT = os.path.join(SOURCE_DIR, "data", "gpl-3.txt")


def pipetrain_cli(*args):
    run = subprocess.run([BINARY, *args], capture_output=True, text=True)
    if run.returncode != 0 and "not available in a sanitizer build" in run.stderr:
        pytest.skip("no tokenizers in a sanitizer build (docs/tokenizer.md)")
    assert run.returncode == 0, run.stderr
    return run.stdout


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tokenizer of 300 pieces trained on the bundled text by the CLI."""
    out = str(tmp_path_factory.mktemp("tok") / "tok")
    pipetrain_cli("tokenizer", "train", "--input", TEXT, "--vocab-size", "300", "--out", out)
    return out


def test_python_ids_are_the_cli_ids(trained, tmp_path):
    tok = tokenizer.load(trained)
    assert tok.vocab_size == 300
    for text in (open(TEXT, "rb").read(), "naïve café ✓\n\n  two  spaces\n".encode()):
        path = tmp_path / "in.txt"
        path.write_bytes(text)
        cli = json.loads(pipetrain_cli("tokenizer", "encode", "--json", "--input", str(path),
                                       "--tokenizer", trained))
        assert cli["vocab_size"] == 300
        assert tok.encode(text).tolist() == cli["ids"]
    # Characters the tokenizer knows decode back exactly (the second text's ï, é, ✓ are <unk>).
    assert tok.decode(tok.encode(open(TEXT, "rb").read())).encode() == open(TEXT, "rb").read()


def test_text_data_set_windows_are_the_tokenizers_ids(trained):
    ids = tokenizer.load(trained).encode(open(TEXT, "rb").read())
    text = data.load("text", context=16, tokenizer=trained)
    assert text.num_classes == 300 and text.tokens_per_sample == 16
    split = len(ids) - len(ids) // 10
    assert (text.size("train"), text.size("eval")) == (split - 16, len(ids) - split - 16)
    x, y = text.samples("train", [5])
    assert np.array_equal(x[:, 0], ids[5:21].astype(np.float32))
    assert np.array_equal(y[:, 0], ids[6:22].astype(np.float32))
    ex, _ = text.samples("eval", [0])
    assert ex[0, 0] == ids[split]


def test_errors(trained, tmp_path):
    with pytest.raises(pipetrain.PipetrainError) as e:
        tokenizer.load(str(tmp_path / "missing"))
    assert e.value.code == StatusCode.NOT_FOUND
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"no model")
    with pytest.raises(pipetrain.PipetrainError) as e:
        tokenizer.load(str(bad))
    assert e.value.code == StatusCode.INVALID_ARGUMENT and "not a SentencePiece model" in str(e.value)
    with pytest.raises(pipetrain.PipetrainError) as e:
        data.load("digits", tokenizer=trained)
    assert e.value.code == StatusCode.INVALID_ARGUMENT
    with pytest.raises(pipetrain.PipetrainError) as e:
        tokenizer.load(trained).decode([300])
    assert "token id 300 at position 0" in str(e.value)


def test_job_checkpoint_carries_the_tokenizer(daemons, example, trained):
    text = data.load("text", context=32, tokenizer=trained)
    directory = os.path.join(daemons.checkpoint_root, "python-tokenizer-ckpt")
    with daemons.client.create_job(model=example("gpt_char.textproto"), stages=2, microbatches=2,
                                   data=text) as job:
        for _ in job.train(data.batches(text, 4, seed=1), steps=1, progress=False):
            pass
        job.checkpoint(directory)
    with open(os.path.join(directory, "tokenizer.model"), "rb") as f:
        assert f.read() == tokenizer.load(trained).model
    with open(os.path.join(directory, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    assert manifest["tokenizer"]["sha256"] == tokenizer.load(trained).sha256
    assert "vocab_size: 300" in manifest["model_spec"]
