"""The data formats users bring, read as the CLI's --data reads them (common/io: dataset.cc's csv:,
npy_dataset.cc's npy:, token_corpus.cc's tokens:; docs/data.md): the same rows, the same float32
values bit for bit, the same held-out split. pipetrain.data.load opens them; use that."""

import gzip
import io
import os
import re
from fractions import Fraction

import numpy as np

from pipetrain.errors import PipetrainError, StatusCode

# Largest class label: labels travel as exactly representable floats.
_MAX_LABEL = 1 << 24
# A single-file token corpus holds out its last tenth, as a text does.
_TOKEN_HOLD_OUT_DIVISOR = 10
_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_ASCII_SPACE = " \t\n\v\f\r"
_NPY_SPELLING = ("npy:FEATURES.npy,TARGETS.npy (two paths, one comma) or npy:DIR (a directory "
                 "holding x.npy and y.npy)")


def _invalid(message):
    return PipetrainError(StatusCode.INVALID_ARGUMENT, message)


def read_file(path, what="data file", gunzip=True):
    """The bytes of `path`, gunzipped (if `gunzip`) when they start with the gzip magic.
    NOT_FOUND if missing."""
    if os.path.isdir(path):
        raise _invalid("%s: '%s' is a directory, not a regular file" % (what, path))
    try:
        with open(path, "rb") as f:
            content = f.read()
    except FileNotFoundError:
        raise PipetrainError(StatusCode.NOT_FOUND, "data file %s not found" % path) from None
    if gunzip and content[:2] == b"\x1f\x8b":
        content = gzip.decompress(content)
    return content


# ----- csv ----------------------------------------------------------------------------------


def _to_float32(texts):
    """float32 of decimal strings, correctly rounded as C++'s absl::SimpleAtof (strtof) rounds:
    via double, with the rare double-rounding ties settled exactly."""
    d = np.array([float(t) for t in texts], dtype=np.float64)
    with np.errstate(over="ignore"):
        f = d.astype(np.float32)
    finite = np.isfinite(f)
    toward = np.where(d > f.astype(np.float64), np.float32(np.inf), np.float32(-np.inf))
    neighbour = np.nextafter(f, toward.astype(np.float32))
    mid = (f.astype(np.float64) + neighbour.astype(np.float64)) / 2
    for i in np.nonzero(finite & (d != f.astype(np.float64)) & (d == mid))[0]:
        exact = Fraction(texts[i].strip(_ASCII_SPACE))
        if exact != Fraction(float(mid[i])):  # not a true tie: round to the nearer side
            f[i] = neighbour[i] if abs(exact - Fraction(float(neighbour[i]))) < abs(
                exact - Fraction(float(f[i]))) else f[i]
    return f


def _csv_number(field, file, line, column, what):
    """Checks `field` as a finite decimal number, as dataset.cc's ParseCsvNumber."""
    where = "%s:%d:%d: %s'%s'" % (file, line, column, what, field[:40] + ("..." if len(field) > 40
                                                                          else ""))
    if not _DECIMAL.fullmatch(field.strip(_ASCII_SPACE)):
        try:
            value = float(field)
        except ValueError:
            raise _invalid(where + " is not a number") from None
        if not np.isfinite(value):
            raise _invalid(where + " is not a finite number")
        raise _invalid(where + " is not a decimal number")


def _csv_label(field, file, line, column):
    where = "%s:%d:%d: class label '%s'" % (file, line, column, field[:40])
    _csv_number(field, file, line, column, "class label ")
    value = float(field)
    if not np.isfinite(value):
        raise _invalid(where + " is not a number")
    if value < 0:
        raise _invalid(where + " is negative")
    if value != np.floor(value):
        raise _invalid(where + " is not an integer (for regression targets, train a model whose "
                               "loss is mse)")
    if value >= _MAX_LABEL:
        raise _invalid(where + " is larger than %d" % (_MAX_LABEL - 1))
    return int(value)


def parse_csv(content, file, regression_targets=0):
    """(features [rows, F], targets [rows, K] float32, num_classes) of CSV `content`: feature
    columns, then an integer label (regression_targets 0) or the last K columns as targets."""
    targets_per_row = max(regression_targets, 1)
    columns = 0
    seen_first = False
    rows = []  # (line number, fields)
    for line_no, line in enumerate(content.decode("latin-1").split("\n"), start=1):
        if line.endswith("\r"):
            line = line[:-1]
        if not line.strip(_ASCII_SPACE):
            continue
        fields = line.split(",")
        if not seen_first:
            seen_first = True
            if not any(_DECIMAL.fullmatch(f.strip(_ASCII_SPACE)) for f in fields):
                columns = len(fields)
                if columns < targets_per_row + 1:
                    raise _invalid("%s:%d: header has %d columns; too few" % (file, line_no,
                                                                              columns))
                continue
        if columns == 0:
            columns = len(fields)
            if columns < targets_per_row + 1:
                raise _invalid("%s:%d: row has %d column(s); too few" % (file, line_no, columns))
        if len(fields) != columns:
            raise _invalid("%s:%d: row has %d columns but %d were expected"
                           % (file, line_no, len(fields), columns))
        rows.append((line_no, fields))
    if not rows:
        raise _invalid("%s: no data rows" % file)
    first_target = columns - targets_per_row
    labels = []
    for line_no, fields in rows:
        for c, field in enumerate(fields):
            if c < first_target or regression_targets > 0:
                _csv_number(field, file, line_no, c + 1, "" if c < first_target else "target ")
            else:
                labels.append(_csv_label(field, file, line_no, c + 1))
    values = _to_float32([f for _, fields in rows for f in fields]).reshape(len(rows), columns)
    if not np.all(np.isfinite(values)):
        r, c = np.argwhere(~np.isfinite(values))[0]
        raise _invalid("%s:%d:%d: '%s' is not a finite number" % (file, rows[r][0], c + 1,
                                                                 rows[r][1][c]))
    num_classes = max(labels) + 1 if regression_targets == 0 else 0
    return values[:, :first_target], values[:, first_target:], num_classes


# ----- npy ----------------------------------------------------------------------------------


def split_npy_spec(arg):
    """(features path, targets path) of "npy:`arg`"."""
    if not arg:
        raise _invalid("dataset spec 'npy:': needs " + _NPY_SPELLING)
    if "," in arg:
        first, _, second = arg.partition(",")
        if not first or not second or "," in second:
            raise _invalid("dataset spec 'npy:%s': expected %s; for paths that contain ',' use "
                           "the directory form" % (arg, _NPY_SPELLING))
        return first, second
    if not os.path.exists(arg):
        raise PipetrainError(StatusCode.NOT_FOUND, "npy data set: cannot read '%s'" % arg)
    if not os.path.isdir(arg):
        raise _invalid("dataset spec 'npy:%s': '%s' is not a directory; expected %s"
                       % (arg, arg, _NPY_SPELLING))
    return os.path.join(arg, "x.npy"), os.path.join(arg, "y.npy")


def read_npy(path):
    """The array of the .npy file `path`, refusing what the C++ reader refuses (big-endian,
    Fortran order, objects, structured or string dtypes, a size that differs from the shape)."""
    content = read_file(path, gunzip=False)  # as the C++ reader: .npy files are not compressed
    if content[:6] != b"\x93NUMPY":
        raise _invalid("%s: not a .npy file (it does not start with \\x93NUMPY)" % path)
    f = io.BytesIO(content)
    try:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0), (3, 0)):
            raise ValueError("version %d.%d" % version)
        # numpy's own parser of the three versions (ast.literal_eval, no pickles).
        read_header = getattr(np.lib.format, "_read_array_header")
        shape, fortran, dtype = read_header(f, version)
    except ValueError as e:
        raise _invalid("%s: .npy header: %s" % (path, e)) from None
    if fortran:
        raise _invalid("%s: fortran_order is True (a column-major array); save a C-order array"
                       % path)
    if dtype.hasobject or dtype.fields is not None or dtype.kind not in "fiub":
        raise _invalid("%s: dtype '%s' is not a supported number type" % (path, dtype.str))
    if dtype.byteorder == ">":
        raise _invalid("%s: dtype '%s' is big-endian" % (path, dtype.str))
    data = content[f.tell():]
    need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != need:
        raise _invalid("%s: the shape %s needs %d data bytes, the file has %d"
                       % (path, shape, need, len(data)))
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _float_matrix(a, path, what):
    if a.dtype != np.dtype("<f4"):
        raise _invalid("%s: %ss must be float32 ('<f4'), found %s ('%s')"
                       % (path, what, a.dtype.name, a.dtype.str))
    if a.ndim not in (1, 2) or a.shape[0] < 1 or (a.ndim == 2 and a.shape[1] < 1):
        raise _invalid("%s: %ss must have shape [rows] or [rows, columns], found %s"
                       % (path, what, a.shape))
    a = a.reshape(a.shape[0], -1)
    bad = np.argwhere(~np.isfinite(a))
    if len(bad):
        r, c = bad[0]
        raise _invalid("%s: %s at row %d, column %d is %s, not a finite number"
                       % (path, what, r, c, a[r, c]))
    return a


def _labels(a, path):
    if a.dtype not in (np.dtype("<i8"), np.dtype("<i4")):
        raise _invalid("%s: class labels (the model's loss is softmax cross-entropy) must be int64 "
                       "or int32, found %s ('%s')" % (path, a.dtype.name, a.dtype.str))
    if a.ndim not in (1, 2) or (a.ndim == 2 and a.shape[1] != 1):
        raise _invalid("%s: class labels must have shape [rows] or [rows, 1], found %s"
                       % (path, a.shape))
    a = a.reshape(-1).astype(np.int64)
    bad = np.nonzero((a < 0) | (a >= _MAX_LABEL))[0]
    if len(bad):
        r = bad[0]
        raise _invalid("%s: row %d: class label %d is %s" % (
            path, r, a[r], "negative" if a[r] < 0 else "larger than %d" % (_MAX_LABEL - 1)))
    return a.astype(np.float32).reshape(-1, 1), int(a.max()) + 1 if len(a) else 0


def load_npy(arg, regression_targets=0):
    """(features, targets, num_classes) of "npy:`arg`" (npy_dataset.h)."""
    x_path, y_path = split_npy_spec(arg)
    x = _float_matrix(read_npy(x_path), x_path, "feature")
    y = read_npy(y_path)
    rows = y.shape[0] if y.ndim else 0
    if rows != x.shape[0]:
        raise _invalid("%s has %d rows but %s has %d" % (x_path, x.shape[0], y_path, rows))
    if regression_targets > 0:
        return x, _float_matrix(y, y_path, "target"), 0
    labels, num_classes = _labels(y, y_path)
    return x, labels, num_classes


# ----- tokens -------------------------------------------------------------------------------


def _map_ids(path, dtype):
    if not os.path.exists(path):
        raise PipetrainError(StatusCode.NOT_FOUND, "token corpus: cannot read '%s'" % path)
    if not os.path.isfile(path):
        raise _invalid("token corpus: '%s' is not a regular file" % path)
    size = os.path.getsize(path)
    if size % dtype.itemsize:
        raise _invalid("%s: %d bytes is not a whole number of %s token ids (%d bytes each)"
                       % (path, size, dtype.name, dtype.itemsize))
    if size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def load_tokens(arg, context, vocab_size=0):
    """[(path, first token, ids) of the training part, ... of the held-out part] and the
    vocabulary of "tokens:`arg`" (token_corpus.h), ids checked against `vocab_size`."""
    path, dtype = arg, np.dtype("<u2")
    if arg.endswith(":uint32"):
        path, dtype = arg[:-len(":uint32")], np.dtype("<u4")
    elif arg.endswith(":uint16"):
        path = arg[:-len(":uint16")]
    if not path:
        raise _invalid("dataset spec 'tokens:%s': needs a path (tokens:PATH[:uint16|:uint32])"
                       % arg)
    if not context or context <= 0:
        raise _invalid("dataset tokens:%s: context %r is out of range (the context of the model's "
                       "embedding)" % (arg, context))
    if os.path.isdir(path):
        train_path, eval_path = os.path.join(path, "train.bin"), os.path.join(path, "val.bin")
        parts = [(train_path, 0, _map_ids(train_path, dtype)),
                 (eval_path, 0, _map_ids(eval_path, dtype))]
    else:
        ids = _map_ids(path, dtype)
        split = len(ids) - len(ids) // _TOKEN_HOLD_OUT_DIVISOR
        parts = [(path, 0, ids[:split]), (path, split, ids[split:])]
    if len(parts[0][2]) <= context:
        raise _invalid("%s: the training part has %d token ids, too few for context %d"
                       % (parts[0][0], len(parts[0][2]), context))
    bound = vocab_size if vocab_size > 0 else _MAX_LABEL
    largest = -1
    for part_path, first, ids in parts:
        if not len(ids):
            continue
        bad = np.nonzero(ids >= bound)[0]
        if len(bad):
            i = int(bad[0])
            raise _invalid("%s: token id %d at token %d (byte %d) is not below %d"
                           % (part_path, ids[i], first + i, (first + i) * dtype.itemsize, bound))
        largest = max(largest, int(ids.max()))
    return parts, vocab_size if vocab_size > 0 else largest + 1
