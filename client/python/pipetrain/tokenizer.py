"""SentencePiece tokenizers as the CLI uses them (docs/tokenizer.md): a tokenizer directory
written by `pipetrain tokenizer train` (tokenizer.model, checked against tokenizer.json's sha256)
or a .model file, and text data sets through one, giving the very token ids of the C++ side
(common/io/tokenizer.h, common/io/token_text_dataset.h): the whole text encoded at once, the last
tenth of the ids held out. Needs python3-sentencepiece.

    tok = pipetrain.tokenizer.load("/tmp/tok")
    data = pipetrain.data.load("text", context=32, tokenizer="/tmp/tok")
"""

import hashlib
import json
import os

import numpy as np

from pipetrain.errors import PipetrainError, StatusCode

MODEL_FILE = "tokenizer.model"
MANIFEST_FILE = "tokenizer.json"
FORMAT = "pipetrain.tokenizer.v1"
MAX_BYTES = 8 << 20  # io::kMaxTokenizerBytes
_HOLD_OUT_DIVISOR = 10  # io::kTokenTextHoldOutDivisor


class Tokenizer:
    """A loaded SentencePiece model. Attributes: origin (the path), model (its bytes), sha256,
    vocab_size."""

    def __init__(self, model, origin):
        try:
            import sentencepiece
        except ImportError:
            raise PipetrainError(StatusCode.FAILED_PRECONDITION,
                                 "tokenizers need the sentencepiece module (Debian: "
                                 "python3-sentencepiece)") from None
        self._sp = sentencepiece.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(model)
        except RuntimeError as e:
            raise PipetrainError(StatusCode.INVALID_ARGUMENT,
                                 "%s: not a SentencePiece model (%s)" % (origin, e)) from None
        self.origin = origin
        self.model = model
        self.sha256 = hashlib.sha256(model).hexdigest()
        self.vocab_size = self._sp.GetPieceSize()

    def encode(self, text):
        """The token ids of `text` (bytes or str), as an int32 array."""
        return np.asarray(self._sp.EncodeAsIds(text), dtype=np.int32)

    def decode(self, ids):
        """The text (str) of `ids`; INVALID_ARGUMENT for an id outside [0, vocab_size)."""
        ids = [int(i) for i in ids]
        for position, i in enumerate(ids):
            if i < 0 or i >= self.vocab_size:
                raise PipetrainError(StatusCode.INVALID_ARGUMENT,
                                     "token id %d at position %d is outside the vocabulary "
                                     "[0, %d) of tokenizer %s" % (i, position, self.vocab_size,
                                                                  self.origin))
        return self._sp.DecodeIds(ids)


def load(path):
    """The tokenizer at `path`: a tokenizer directory or a SentencePiece .model file. Raises
    PipetrainError: NOT_FOUND (missing, or a directory without tokenizer.model), INVALID_ARGUMENT
    (not a SentencePiece model, a bad tokenizer.json), DATA_LOSS (the model differs from
    tokenizer.json's sha256), RESOURCE_EXHAUSTED (above 8 MiB)."""
    expected = None
    file = path
    if os.path.isdir(path):
        file = os.path.join(path, MODEL_FILE)
        if not os.path.exists(file):
            raise PipetrainError(StatusCode.NOT_FOUND,
                                 "tokenizer directory %s holds no %s" % (path, MODEL_FILE))
        manifest = os.path.join(path, MANIFEST_FILE)
        if os.path.exists(manifest):
            try:
                with open(manifest, "rb") as f:
                    m = json.loads(f.read())
                if m.get("format") != FORMAT:
                    raise ValueError("format")
                expected = m["sha256"]
            except (ValueError, KeyError, TypeError, AttributeError):
                raise PipetrainError(StatusCode.INVALID_ARGUMENT,
                                     "%s: not a tokenizer manifest" % manifest) from None
    try:
        size = os.path.getsize(file)
        if size > MAX_BYTES:
            raise PipetrainError(StatusCode.RESOURCE_EXHAUSTED,
                                 "tokenizer %s of %d bytes is larger than the limit of %d"
                                 % (file, size, MAX_BYTES))
        with open(file, "rb") as f:
            model = f.read()
    except FileNotFoundError:
        raise PipetrainError(StatusCode.NOT_FOUND, "tokenizer %s not found" % file) from None
    tokenizer = Tokenizer(model, file)
    if expected is not None and tokenizer.sha256 != expected:
        raise PipetrainError(StatusCode.DATA_LOSS,
                             "%s: SHA-256 %s differs from the %s's %s"
                             % (file, tokenizer.sha256, MANIFEST_FILE, expected))
    return tokenizer


def token_text_dataset(name, path, text, context, tokenizer):
    """The data set of `text` (bytes, read from `path`) encoded by `tokenizer` (a Tokenizer or a
    path), windows of `context` tokens: what data.load("text[:PATH]", tokenizer=...) returns."""
    from pipetrain import data  # data imports this module lazily
    if not isinstance(tokenizer, Tokenizer):
        tokenizer = load(tokenizer)
    ids = tokenizer.encode(text)
    split = len(ids) - len(ids) // _HOLD_OUT_DIVISOR
    if split <= context:
        raise PipetrainError(StatusCode.INVALID_ARGUMENT,
                             "%s: text of %d bytes is %d tokens with tokenizer %s, too few for "
                             "context %d" % (path, len(text), len(ids), tokenizer.origin, context))

    class _TokenTextDataset(data.Dataset):
        def __init__(self):
            super().__init__(name, 1, 1, context, tokenizer.vocab_size)
            self.tokenizer = tokenizer
            self._ids = ids.astype(np.float32)
            self._split = split

        def size(self, split="train"):
            data._check_split(split)
            part = self._split if split == "train" else len(self._ids) - self._split
            return max(0, part - context)

        def samples(self, split, indices):
            data._check_split(split)
            start = np.asarray(indices, dtype=np.int64) + (0 if split == "train" else self._split)
            window = start[:, None] + np.arange(context)[None, :]
            return self._ids[window].reshape(-1, 1), self._ids[window + 1].reshape(-1, 1)

    return _TokenTextDataset()
