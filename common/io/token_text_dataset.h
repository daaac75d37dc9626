// A text data set read through a tokenizer (`--data text[:PATH] --tokenizer DIR`): the text's
// token ids, cut into windows of `context` tokens like the byte-level text data set
// (docs/data.md, docs/tokenizer.md). OpenDataset opens it for a text spec when
// DatasetOptions::tokenizer is set.
#ifndef PIPETRAIN_COMMON_IO_TOKEN_TEXT_DATASET_H_
#define PIPETRAIN_COMMON_IO_TOKEN_TEXT_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/io/dataset.h"
#include "common/io/tokenizer.h"

namespace pipetrain::io {

// The held-out part of a tokenized text: its last 1/kTokenTextHoldOutDivisor of the token ids.
inline constexpr int64_t kTokenTextHoldOutDivisor = 10;

// The data set of `text` (the file `path`, named `name`, e.g. "text" or "text:PATH") encoded at
// once by `tokenizer` into ids t[0..n): the first n - n/10 ids are the training part, the rest the
// held-out part; sample i of a part is inputs t[i..i+context) and targets t[i+1..i+context+1)
// within the part. info(): input_features 1, target_features 1, tokens_per_sample `context`,
// num_classes tokenizer.vocab_size() (the model's vocab_size 0 is filled with it), vocabulary
// empty. `context` must be in [1, kMaxTextContext] (checked by the caller). Errors:
// INVALID_ARGUMENT naming `path` if the text encodes to too few tokens for one training window
// (the message gives the counts) or the tokenizer fails; RESOURCE_EXHAUSTED if the windows exceed
// options.max_samples. The data set keeps `tokenizer`.
absl::StatusOr<std::unique_ptr<Dataset>> OpenTokenText(const std::string& name,
                                                       const std::string& path,
                                                       absl::string_view text, int64_t context,
                                                       std::shared_ptr<const Tokenizer> tokenizer,
                                                       const DatasetOptions& options);

}  // namespace pipetrain::io

#endif  // PIPETRAIN_COMMON_IO_TOKEN_TEXT_DATASET_H_
