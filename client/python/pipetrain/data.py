"""The CLI's data sets and batch order, so that a Python run sees the very batches `pipetrain
train --data SPEC --seed S --batch B` sends (and the same per-step losses, bit for bit), for
digits, text, csv:, npy: and tokens: (the last three read by pipetrain.formats).

Reproduces common/io/dataset.{h,cc} (docs/data.md): the bundled digits (pixels / 16, every 5th
row held out) and text data sets (byte-level, last tenth held out), and BatchSampler's order —
epoch e is a Fisher–Yates permutation driven by std::mt19937_64 seeded with
mix(mix(seed) ^ mix(e + 0x5eed)), mix = SplitMix64 (x + 0x9E3779B97F4A7C15, then its finaliser),
each index drawn by rejection on the smallest covering bit mask; floor(N / B) batches per epoch.

    data = pipetrain.data.load("digits")
    for inputs, targets in pipetrain.data.batches(data, batch_size=64, seed=1, steps=100): ...
"""

import gzip
import os

import numpy as np

from pipetrain import formats
from pipetrain.errors import PipetrainError, StatusCode

_MASK64 = (1 << 64) - 1
# Table data sets hold out every 5th row (rows 4, 9, 14, ...); text its last tenth.
_HOLD_OUT_PERIOD = 5
_TEXT_HOLD_OUT_DIVISOR = 10
_BUNDLED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bundled")


def mix64(x):
    """SplitMix64: the finaliser of x + 0x9E3779B97F4A7C15 (common/io/dataset.cc, Mix64)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class MT19937_64:
    """The 64-bit Mersenne Twister exactly as C++'s std::mt19937_64 (its output sequence is fixed
    by the C++ standard: the 10000th output of a default-seeded engine is 9981545732273789042).
    Python's `random` and numpy only ship the 32-bit variant."""

    _N, _M = 312, 156
    _UPPER, _LOWER = 0xFFFFFFFF80000000, 0x7FFFFFFF
    _MATRIX = 0xB5026F5AA96619E9

    def __init__(self, seed=5489):
        mt = [seed & _MASK64]
        for i in range(1, self._N):
            prev = mt[-1]
            mt.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & _MASK64)
        self._mt = mt
        self._index = self._N

    def _twist(self):
        mt, n, m = self._mt, self._N, self._M
        for i in range(n):
            y = (mt[i] & self._UPPER) | (mt[(i + 1) % n] & self._LOWER)
            mt[i] = mt[(i + m) % n] ^ (y >> 1) ^ (self._MATRIX if y & 1 else 0)
        self._index = 0

    def __call__(self):
        """The next 64-bit output."""
        if self._index >= self._N:
            self._twist()
        x = self._mt[self._index]
        self._index += 1
        x ^= (x >> 29) & 0x5555555555555555
        x ^= (x << 17) & 0x71D67FFFEDA60000
        x ^= (x << 37) & 0xFFF7EEE000000000
        x ^= x >> 43
        return x & _MASK64


def _bounded_draw(gen, bound):
    """An unbiased draw from [0, bound) by rejection on the smallest covering bit mask."""
    if bound <= 1:
        return 0
    mask = (1 << (bound - 1).bit_length()) - 1
    while True:
        x = gen() & mask
        if x < bound:
            return x


def epoch_permutation(train_size, seed, epoch):
    """The order in which epoch `epoch` visits the training samples (BatchSampler's)."""
    perm = list(range(max(train_size, 0)))
    gen = MT19937_64(mix64(mix64(seed & _MASK64) ^ mix64((epoch + 0x5EED) & _MASK64)))
    for i in range(len(perm), 1, -1):
        j = _bounded_draw(gen, i)
        perm[i - 1], perm[j] = perm[j], perm[i - 1]
    return perm


class Dataset:
    """An in-memory data set split into a training and a held-out part, as common/io/dataset.h.

    Attributes: name, input_features, target_features, tokens_per_sample, num_classes,
    vocabulary (text: bytes, token i is vocabulary[i]). A sample is tokens_per_sample rows of
    input_features inputs and target_features targets, float32."""

    def __init__(self, name, input_features, target_features, tokens_per_sample, num_classes,
                 vocabulary=b""):
        self.name = name
        self.input_features = input_features
        self.target_features = target_features
        self.tokens_per_sample = tokens_per_sample
        self.num_classes = num_classes
        self.vocabulary = vocabulary

    @property
    def shape(self):
        """The JobSpec.data_shape fields: what the coordinator fills a spec's 0 sizes from."""
        return {"input_features": self.input_features, "target_features": self.target_features,
                "num_classes": self.num_classes, "tokens_per_sample": self.tokens_per_sample}

    def size(self, split="train"):
        """Samples in `split` ("train" or "eval")."""
        raise NotImplementedError

    def samples(self, split, indices):
        """(inputs, targets) of the samples `indices` of `split`, in that order: float32 arrays of
        [len(indices) * tokens_per_sample, input_features] and [..., target_features]."""
        raise NotImplementedError


def _check_split(split):
    if split not in ("train", "eval"):
        raise PipetrainError(StatusCode.INVALID_ARGUMENT,
                             "split must be 'train' or 'eval', got %r" % (split,))


class _TableDataset(Dataset):
    def __init__(self, name, values, labels, num_classes):
        labels = labels.reshape(values.shape[0], -1)
        super().__init__(name, values.shape[1], labels.shape[1], 1, num_classes)
        rows = values.shape[0]
        all_rows = np.arange(rows)
        held_out = all_rows % _HOLD_OUT_PERIOD == _HOLD_OUT_PERIOD - 1
        self._rows = {"train": all_rows[~held_out], "eval": all_rows[held_out]}
        self._values = values
        self._labels = labels

    def size(self, split="train"):
        _check_split(split)
        return len(self._rows[split])

    def samples(self, split, indices):
        _check_split(split)
        rows = self._rows[split][np.asarray(indices, dtype=np.int64)]
        return self._values[rows], self._labels[rows]


class _TextDataset(Dataset):
    def __init__(self, name, text, context):
        vocabulary = bytes(sorted(set(text)))
        ids = np.zeros(256, dtype=np.float32)
        ids[np.frombuffer(vocabulary, dtype=np.uint8)] = np.arange(len(vocabulary))
        super().__init__(name, 1, 1, context, len(vocabulary), vocabulary)
        self._ids = ids[np.frombuffer(text, dtype=np.uint8)]
        self._split = len(text) - len(text) // _TEXT_HOLD_OUT_DIVISOR
        self._context = context

    def size(self, split="train"):
        _check_split(split)
        part = self._split if split == "train" else len(self._ids) - self._split
        return max(0, part - self._context)

    def samples(self, split, indices):
        _check_split(split)
        start = np.asarray(indices, dtype=np.int64) + (0 if split == "train" else self._split)
        window = start[:, None] + np.arange(self._context)[None, :]
        return self._ids[window].reshape(-1, 1), self._ids[window + 1].reshape(-1, 1)


class _TokenDataset(Dataset):
    """tokens: windows of context + 1 ids, as _TextDataset's (common/io/token_corpus.h)."""

    def __init__(self, name, parts, vocab_size, context):
        super().__init__(name, 1, 1, context, vocab_size)
        self._parts = {"train": parts[0][2], "eval": parts[1][2]}
        self._context = context

    def size(self, split="train"):
        _check_split(split)
        return max(0, len(self._parts[split]) - self._context)

    def samples(self, split, indices):
        _check_split(split)
        ids = self._parts[split]
        window = np.asarray(indices, dtype=np.int64)[:, None] + np.arange(self._context)[None, :]
        return (ids[window].astype(np.float32).reshape(-1, 1),
                ids[window + 1].astype(np.float32).reshape(-1, 1))


def load(spec="digits", context=None, data_dir=None, tokenizer=None, regression_targets=0,
         vocab_size=0):
    """Opens the data set `spec` as the CLI's --data does: "digits", "text" (the bundled GPL-3
    text), "text:PATH" (byte-level), "csv:PATH", "npy:X.npy,Y.npy" or "npy:DIR",
    "tokens:PATH[:uint16|:uint32]" (docs/data.md); text and tokens need `context` (the model's
    embedding context). `tokenizer` (a tokenizer directory or .model path, or a
    pipetrain.tokenizer.Tokenizer): text becomes its token ids, as --tokenizer does
    (pipetrain/tokenizer.py). `regression_targets` K > 0 (a model whose loss is mse, with K
    outputs): csv: reads its last K columns as targets and npy: wants float32 targets.
    `vocab_size` (tokens:): the model's vocabulary, every id must be below it. `data_dir`
    overrides where the bundled files are (default: the copy installed with this package). Raises
    PipetrainError: INVALID_ARGUMENT for an unknown spec, a missing context or a malformed file,
    NOT_FOUND for a missing file, DATA_LOSS for a damaged bundled digits file."""
    data_dir = data_dir or _BUNDLED_DIR
    kind, _, arg = spec.partition(":")
    if tokenizer is not None and kind != "text":
        raise PipetrainError(StatusCode.INVALID_ARGUMENT,
                             "a tokenizer applies to text data sets (text, text:PATH), not to %r"
                             % (spec,))
    if kind == "csv" and arg:
        values, targets, num_classes = formats.parse_csv(formats.read_file(arg), arg,
                                                         regression_targets)
        return _TableDataset(spec, values, targets, num_classes)
    if kind == "npy":
        values, targets, num_classes = formats.load_npy(arg, regression_targets)
        return _TableDataset(spec, values, targets, num_classes)
    if kind == "tokens":
        parts, vocabulary = formats.load_tokens(arg, context, vocab_size)
        return _TokenDataset(spec, parts, vocabulary, context)
    if kind == "digits" and not arg and ":" not in spec:
        return _load_digits(os.path.join(data_dir, "digits.csv.gz"))
    if kind == "text" and (arg or ":" not in spec):
        if not context or context <= 0:
            raise PipetrainError(StatusCode.INVALID_ARGUMENT,
                                 "dataset %s: context must be > 0 for a text dataset, got %r"
                                 % (spec, context))
        path = arg or os.path.join(data_dir, "gpl-3.txt")
        text = _read(path)
        if len(text) - len(text) // _TEXT_HOLD_OUT_DIVISOR <= context:
            raise PipetrainError(StatusCode.INVALID_ARGUMENT,
                                 "%s: text of %d bytes is too short for context %d"
                                 % (path, len(text), context))
        if tokenizer is not None:
            from pipetrain import tokenizer as tokenizers
            return tokenizers.token_text_dataset(spec, path, text, context, tokenizer)
        return _TextDataset(spec, text, context)
    raise PipetrainError(
        StatusCode.INVALID_ARGUMENT,
        "unknown dataset spec %r (expected digits, text, text:PATH, csv:PATH, npy:X.npy,Y.npy, "
        "npy:DIR or tokens:PATH[:uint16|:uint32]; for others pass your own arrays)" % (spec,))


def load_for_model(spec, model, data_dir=None, tokenizer=None):
    """load(spec) with what the CLI takes from `model` (what create_job takes: a ModelSpec
    message, a path to a protobuf text file or the text itself): the context and vocabulary of its
    embedding, and with an mse loss the regression targets per row (the last linear layer's
    out_features, 1 when left 0). A text data set for a model without an embedding is
    INVALID_ARGUMENT saying so."""
    from pipetrain.client import model_spec  # the client imports nothing of this module

    model = model_spec(model)
    context, vocab_size, outputs = None, 0, 0
    for layer in model.layers:
        if layer.HasField("embedding"):
            context, vocab_size = layer.embedding.context, layer.embedding.vocab_size
    if context is None and _is_text(spec):
        raise PipetrainError(
            StatusCode.INVALID_ARGUMENT,
            "data set %s is text, token ids for a model whose first layer is an embedding (its "
            "context is the tokens per sample), and the model has none: use a token model (e.g. "
            "examples/gpt_char.textproto), or a data set of feature rows for this one (digits)"
            % spec)
    if model.layers and model.layers[-1].HasField("linear"):
        outputs = model.layers[-1].linear.out_features
    regression_targets = (outputs or 1) if model.loss.HasField("mse") else 0
    return load(spec, context=context, data_dir=data_dir, tokenizer=tokenizer,
                regression_targets=regression_targets, vocab_size=vocab_size)


def _is_text(spec):
    return isinstance(spec, str) and (spec == "text" or spec.startswith("text:"))


def _read(path):
    try:
        with open(path, "rb") as f:
            content = f.read()
    except FileNotFoundError:
        raise PipetrainError(StatusCode.NOT_FOUND, "data file %s not found" % path) from None
    if content[:2] == b"\x1f\x8b":
        content = gzip.decompress(content)
    return content


def _load_digits(path):
    try:
        table = np.loadtxt(_read(path).decode("ascii").splitlines(), delimiter=",", dtype=np.int64)
    except ValueError as e:
        raise PipetrainError(StatusCode.DATA_LOSS,
                             "bundled digits data %s is corrupt: %s" % (path, e)) from None
    if table.shape != (1797, 65) or table[:, :64].min() < 0 or table[:, :64].max() > 16:
        raise PipetrainError(StatusCode.DATA_LOSS,
                             "%s: bundled digits data is not 1797 rows of 64 pixels in [0, 16] "
                             "and a label" % path)
    values = table[:, :64].astype(np.float32) / np.float32(16)  # exact: a power of two
    return _TableDataset("digits", values, table[:, 64].astype(np.float32), 10)


class BatchSampler:
    """Deterministic shuffled batches of the training split, as the CLI's BatchSampler: the same
    (data set, batch_size, seed, cursor) give the same batches. Iterating yields
    (inputs, targets) float32 arrays without end; `cursor` is (epoch, batch) of the next one."""

    def __init__(self, dataset, batch_size, seed=0, cursor=(0, 0)):
        train = dataset.size("train")
        if batch_size <= 0 or batch_size > train:
            raise PipetrainError(StatusCode.INVALID_ARGUMENT,
                                 "batch size %d must be in [1, %d] (the training split of %s has "
                                 "%d samples)" % (batch_size, train, dataset.name, train))
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.batches_per_epoch = train // batch_size
        epoch, batch = cursor
        if epoch < 0 or not 0 <= batch < self.batches_per_epoch:
            raise PipetrainError(StatusCode.INVALID_ARGUMENT,
                                 "data cursor (epoch %d, batch %d) is invalid: need epoch >= 0 and "
                                 "batch in [0, %d)" % (epoch, batch, self.batches_per_epoch))
        self.cursor = (epoch, batch)
        self._permutation_epoch = -1
        self._permutation = None

    def __iter__(self):
        return self

    def __next__(self):
        epoch, batch = self.cursor
        if self._permutation_epoch != epoch:
            self._permutation = np.asarray(
                epoch_permutation(self.dataset.size("train"), self.seed, epoch), dtype=np.int64)
            self._permutation_epoch = epoch
        b = self.batch_size
        indices = self._permutation[batch * b:(batch + 1) * b]
        batch += 1
        self.cursor = (epoch + 1, 0) if batch == self.batches_per_epoch else (epoch, batch)
        return self.dataset.samples("train", indices)


def batches(dataset, batch_size, seed=0, steps=None, cursor=(0, 0)):
    """The first `steps` batches (all, without end, if None) of BatchSampler(dataset, batch_size,
    seed, cursor): what `pipetrain train --steps steps --batch batch_size --seed seed` sends."""
    sampler = BatchSampler(dataset, batch_size, seed, cursor)
    if steps is None:
        yield from sampler
        return
    for _ in range(steps):
        yield next(sampler)


def eval_batch(dataset, begin=0, count=None):
    """Held-out samples [begin, begin + count) in order (clamped to what exists), as the CLI's
    evaluation takes them."""
    available = dataset.size("eval")
    count = available - begin if count is None else count
    count = max(0, min(count, available - begin)) if 0 <= begin < available else 0
    return dataset.samples("eval", np.arange(begin, begin + count))
