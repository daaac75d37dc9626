#include "common/io/token_text_dataset.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace pipetrain::io {
namespace {

class TokenTextDataset : public Dataset {
 public:
  TokenTextDataset(std::string name, std::vector<int32_t> ids, int64_t context,
                   std::shared_ptr<const Tokenizer> tokenizer)
      : ids_(std::move(ids)), context_(context), tokenizer_(std::move(tokenizer)) {
    const int64_t length = static_cast<int64_t>(ids_.size());
    split_ = length - length / kTokenTextHoldOutDivisor;
    info_.name = std::move(name);
    info_.input_features = 1;
    info_.target_features = 1;
    info_.tokens_per_sample = context;
    info_.num_classes = tokenizer_->vocab_size();
  }

  const DatasetInfo& info() const override { return info_; }

  int64_t size(Split split) const override {
    // A window needs context + 1 tokens inside its part.
    const int64_t part =
        split == Split::kTrain ? split_ : static_cast<int64_t>(ids_.size()) - split_;
    return std::max<int64_t>(0, part - context_);
  }

  void GetSample(Split split, int64_t index, float* inputs, float* targets) const override {
    if (index < 0 || index >= size(split)) {
      std::fprintf(stderr, "pipetrain: dataset %s: %s sample index %lld out of range [0, %lld)\n",
                   info_.name.c_str(), split == Split::kTrain ? "train" : "eval",
                   static_cast<long long>(index), static_cast<long long>(size(split)));
      std::abort();
    }
    const int32_t* p = ids_.data() + (split == Split::kTrain ? 0 : split_) + index;
    for (int64_t t = 0; t < context_; ++t) {
      inputs[t] = static_cast<float>(p[t]);
      targets[t] = static_cast<float>(p[t + 1]);
    }
  }

  int64_t tokens() const { return static_cast<int64_t>(ids_.size()); }
  int64_t split_point() const { return split_; }

 private:
  DatasetInfo info_;
  std::vector<int32_t> ids_;
  int64_t context_;
  int64_t split_ = 0;
  std::shared_ptr<const Tokenizer> tokenizer_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> OpenTokenText(const std::string& name,
                                                       const std::string& path,
                                                       absl::string_view text, int64_t context,
                                                       std::shared_ptr<const Tokenizer> tokenizer,
                                                       const DatasetOptions& options) {
  PT_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->Encode(text));
  const std::string tokenizer_name = tokenizer->origin();
  const int64_t tokens = static_cast<int64_t>(ids.size());
  auto dataset =
      std::make_unique<TokenTextDataset>(name, std::move(ids), context, std::move(tokenizer));
  const int64_t samples = dataset->size(Split::kTrain) + dataset->size(Split::kEval);
  if (samples > options.max_samples) {
    return absl::ResourceExhaustedError(absl::StrCat(
        path, ": text of ", tokens, " tokens has ", samples, " windows: more than the limit of ",
        options.max_samples, " samples (DatasetOptions::max_samples)"));
  }
  if (dataset->size(Split::kTrain) < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": text of ", text.size(), " bytes is ", tokens, " tokens with tokenizer ",
        tokenizer_name, ", too few for context ", context, ": the training part (first ",
        dataset->split_point(), " tokens) needs at least ", context + 1));
  }
  return std::unique_ptr<Dataset>(std::move(dataset));
}

}  // namespace pipetrain::io
