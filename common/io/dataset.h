// Datasets (bundled digits and text, users' CSV and text files, a synthetic generator) and
// deterministic batching. Formats, splits and the --data syntax are described in docs/data.md.
//
// A sample is `tokens_per_sample` rows; each row has `input_features` input floats and
// `target_features` target floats. Class labels and token ids are stored as exactly
// representable floats. A batch of b samples is a pair of row-major matrices with
// b * tokens_per_sample rows, ready to be split into micro-batches of consecutive rows.
#ifndef PIPETRAIN_COMMON_IO_DATASET_H_
#define PIPETRAIN_COMMON_IO_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/io/data_dir.h"
#include "common/math/tensor.h"

namespace pipetrain::io {

class Tokenizer;  // common/io/tokenizer.h

// Class labels are below kMaxClassLabel (2^24): they travel as floats and must stay exact.
inline constexpr int64_t kMaxClassLabel = int64_t{1} << 24;

// Which part of a dataset: the training part or the held-out part.
enum class Split { kTrain, kEval };

// Shape and description of a dataset.
struct DatasetInfo {
  std::string name;               // "digits", "text:PATH", "csv:PATH", "synthetic:ROWS", ...
  int64_t input_features = 0;     // floats per input row (1 for text: the token id)
  int64_t target_features = 0;    // floats per target row (1: a class index / next-token id)
  int64_t tokens_per_sample = 1;  // rows per sample (the context for text, else 1)
  int64_t num_classes = 0;        // classes (vocabulary size for text), 0 for regression targets
  std::string vocabulary;         // text only: the i-th byte is token i (sorted)
  bool token_ids = false;         // inputs are token ids (text, tokens): for an embedding model
};

// An immutable, in-memory (or computed-on-demand) dataset. All methods are const and
// thread-safe.
class Dataset {
 public:
  virtual ~Dataset();

  virtual const DatasetInfo& info() const = 0;

  // Number of samples in `split` (>= 1 for kTrain; kEval may be 0 for tiny inputs).
  virtual int64_t size(Split split) const = 0;

  // Writes sample `index` of `split`: tokens_per_sample x input_features floats to `inputs` and
  // tokens_per_sample x target_features floats to `targets`, both row-major. Requires
  // 0 <= index < size(split) (aborts otherwise: a programming error, not a data error).
  virtual void GetSample(Split split, int64_t index, float* inputs, float* targets) const = 0;

  // For binding the data set to a model whose loss takes class labels (softmax cross-entropy),
  // which outputs `model_classes` scores per row: OK if every target of both splits is a class
  // below `model_classes` (always when info().num_classes <= model_classes). Otherwise
  // INVALID_ARGUMENT naming the first target beyond it and the model's classes:
  // "FILE:LINE:COLUMN: class label 7 is out of range for the model, whose last layer outputs 3
  // classes (labels 0 to 2)" for a CSV file (the first such row in the file), "FILE: byte 16
  // ('e', token 5) is out of range ..." for a text, else the split and sample index. (Negative
  // labels never get here: the readers refuse them.) O(1) when the labels fit; else at most one
  // pass over the samples. Thread-safe.
  virtual absl::Status CheckLabelsForModel(int64_t model_classes) const;
};

// How OpenDataset builds a dataset. The model supplies the shape-dependent fields.
struct DatasetOptions {
  // Directory holding the bundled files (digits.csv.gz, gpl-3.txt). Default: $PIPETRAIN_DATA_DIR,
  // else share/pipetrain/data beside the executable's bin/ directory (DefaultDataDir()).
  std::string data_dir = DefaultDataDir();
  // Text datasets: tokens per sample (the model's context length). Must be in
  // [1, kMaxTextContext] for text.
  int64_t context = 0;
  // Text datasets: the tokenizer that turns the text into token ids
  // (common/io/token_text_dataset.h); null (default): byte-level ids. Set for any other spec:
  // INVALID_ARGUMENT.
  std::shared_ptr<const Tokenizer> tokenizer;
  // Synthetic dataset: features per row and number of classes (both must be > 0; classes >= 2).
  int64_t input_features = 0;
  int64_t num_classes = 0;
  // The model's loss: 0 if it takes class labels (softmax cross-entropy), else the regression
  // targets per row it takes (mse: the model's output width). csv: reads the last this many
  // columns as float targets instead of one integer label; npy: wants float32 targets instead of
  // integer labels.
  int64_t regression_targets = 0;
  // Token data sets (tokens:): the model's vocabulary (its embedding's vocab_size); every id must
  // be below it. 0: the largest id + 1.
  int64_t vocab_size = 0;
  // Synthetic dataset: total rows when the spec gives none ("synthetic" vs "synthetic:ROWS").
  int64_t synthetic_rows = 4096;
  // Synthetic dataset: seed of the features and of the teacher that labels them.
  uint64_t seed = 0;
  // Largest data file (csv:, text: and the bundled files) in bytes, after decompression: a larger
  // file is RESOURCE_EXHAUSTED before it is parsed. Parsing takes up to about 5 times this.
  int64_t max_file_bytes = int64_t{1} << 30;  // 1 GiB
  // Most samples (table or synthetic rows, text windows) a dataset may have: shuffling keeps an
  // 8-byte index per training sample (512 MiB at the default). More is RESOURCE_EXHAUSTED.
  int64_t max_samples = int64_t{1} << 26;  // 67,108,864
};

// Largest context of a text data set: a model's largest dimension (docs/numerics.md, "Limits").
inline constexpr int64_t kMaxTextContext = int64_t{1} << 24;

// Largest batch BatchSampler::Create accepts: samples x tokens_per_sample x (input_features +
// target_features) x 4 bytes.
inline constexpr int64_t kMaxBatchBytes = int64_t{1} << 30;  // 1 GiB

// Opens the dataset named by `spec`:
//   digits            bundled UCI optical digits (64 features scaled to [0, 1], 10 classes)
//   text              bundled text (GPL-3 license), char (byte) level language modelling
//   text:PATH         the file at PATH, byte-level language modelling
//                     (both text forms: token ids of options.tokenizer when it is set)
//   csv:PATH          numeric feature columns then an integer class label >= 0 (or, with
//                     options.regression_targets K > 0, then K numeric targets); optional header
//   npy:X.npy,Y.npy   NumPy arrays: float32 features [N, F] and int64/int32 labels [N] (or float32
//   npy:DIR           targets [N, K] for regression); DIR holds x.npy and y.npy (npy_dataset.h)
//   tokens:PATH[:uint16|:uint32]  a flat file of token ids as nanoGPT writes it, or a directory
//                     of train.bin and val.bin (token_corpus.h)
//   synthetic[:ROWS]  N(0, 1) features labelled by a fixed random linear teacher
//   (npy: and tokens: files are read as they are, never decompressed.)
// Files may be gzip-compressed. Errors: INVALID_ARGUMENT for an unknown spec, bad options, a path
// that is not a regular file (a directory, /dev/zero, a FIFO) or a malformed file (the message
// names file:line:column); NOT_FOUND for a missing file; RESOURCE_EXHAUSTED naming the numbers
// for a file larger than options.max_file_bytes, more samples than options.max_samples, or memory
// that cannot be allocated; DATA_LOSS for a corrupt compressed file or a corrupt bundled file.
absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(absl::string_view spec,
                                                     const DatasetOptions& options);

// Position of the next batch a BatchSampler returns.
struct DataCursor {
  int64_t epoch = 0;
  int64_t batch = 0;  // in [0, batches_per_epoch)
};

// A batch of `samples` samples: inputs [samples * tokens_per_sample, input_features] and
// targets [samples * tokens_per_sample, target_features].
struct Batch {
  math::Matrix inputs;
  math::Matrix targets;
  int64_t samples = 0;
};

// Deterministic shuffled batches of the training split. Epoch e visits the training samples in a
// permutation determined only by (seed, e) (Fisher-Yates with std::mt19937_64 and an unbiased
// rejection-sampled bounded draw, so the order is the same on every platform); it yields
// floor(N / batch_size) batches and drops the remainder. Not thread-safe; does not own the dataset,
// which must outlive it. Copyable and movable.
class BatchSampler {
 public:
  // INVALID_ARGUMENT if `dataset` is null, batch_size is <= 0 or larger than the training split,
  // or `start` is not a valid position (epoch < 0, batch outside [0, batches_per_epoch)).
  // RESOURCE_EXHAUSTED if a batch would take more than kMaxBatchBytes.
  static absl::StatusOr<BatchSampler> Create(const Dataset* dataset, int64_t batch_size,
                                             uint64_t seed, DataCursor start = {});

  // Returns the batch at cursor() and advances the cursor (to the next epoch after the last
  // batch of an epoch).
  Batch Next();

  // The position of the batch the next call to Next() returns; restarting a sampler with the
  // same dataset, batch size and seed at this cursor reproduces the same subsequent batches.
  DataCursor cursor() const { return cursor_; }

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t batch_size() const { return batch_size_; }

  // The order in which epoch `epoch` visits the training indices (all of them, including the
  // dropped remainder at the end). Exposed for tests and tools.
  static std::vector<int64_t> EpochPermutation(int64_t train_size, uint64_t seed, int64_t epoch);

 private:
  BatchSampler(const Dataset* dataset, int64_t batch_size, uint64_t seed, DataCursor start);

  const Dataset* dataset_;
  int64_t batch_size_;
  uint64_t seed_;
  int64_t batches_per_epoch_;
  DataCursor cursor_;
  int64_t permutation_epoch_ = -1;  // epoch `permutation_` belongs to
  std::vector<int64_t> permutation_;
};

// Returns eval samples [begin, begin + count) of `dataset` as one batch, in order. `count` is
// clamped to the samples available, so the result may have fewer samples (0 if begin is out of
// range). Thread-safe.
Batch MakeEvalBatch(const Dataset& dataset, int64_t begin, int64_t count);

}  // namespace pipetrain::io

#endif  // PIPETRAIN_COMMON_IO_DATASET_H_
