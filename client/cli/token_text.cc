#include "client/cli/token_text.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace pipetrain::cli {

absl::StatusOr<TokenText> TokenText::For(std::shared_ptr<const io::Tokenizer> tokenizer,
                                         const io::DatasetInfo& data, int64_t vocab_size,
                                         absl::string_view fix) {
  TokenText t;
  t.tokenizer_ = std::move(tokenizer);
  if (t.tokenizer_ != nullptr) return t;
  absl::StatusOr<io::ByteVocabulary> bytes = io::ByteVocabulary::Create(data.vocabulary);
  if (!bytes.ok() || bytes->size() != vocab_size) {
    return absl::FailedPreconditionError(absl::StrCat("data set '", data.name,
                                                      "' has no byte vocabulary of the model's ",
                                                      vocab_size, " tokens: ", fix));
  }
  t.bytes_ = *std::move(bytes);
  return t;
}

absl::StatusOr<std::vector<int64_t>> TokenText::Encode(const std::string& text) const {
  if (tokenizer_ == nullptr) return bytes_->Encode(text);
  PT_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer_->Encode(text));
  return std::vector<int64_t>(ids.begin(), ids.end());
}

std::string TokenText::Next(int64_t token) {
  if (tokenizer_ == nullptr) return std::string(1, bytes_->byte(token));
  generated_.push_back(static_cast<int32_t>(token));
  absl::StatusOr<std::string> text = tokenizer_->Decode(generated_);
  if (!text.ok() || text->size() <= shown_) return "";
  std::string added = text->substr(shown_);
  shown_ = text->size();
  return added;
}

}  // namespace pipetrain::cli
