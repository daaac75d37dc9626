// TokenText: a language model's text to token ids and back, as `pipetrain generate` prints it:
// with a SentencePiece tokenizer, or else the byte vocabulary of a text data set.
#ifndef PIPETRAIN_CLIENT_CLI_TOKEN_TEXT_H_
#define PIPETRAIN_CLIENT_CLI_TOKEN_TEXT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/io/byte_vocabulary.h"
#include "common/io/dataset.h"
#include "common/io/tokenizer.h"

namespace pipetrain::cli {

class TokenText {
 public:
  // The codec of `tokenizer` if it is set, else of data set `data`'s byte vocabulary for a model
  // of `vocab_size` tokens: FAILED_PRECONDITION if the data set has none of that size, the
  // message ending with `fix` (what to give instead).
  static absl::StatusOr<TokenText> For(std::shared_ptr<const io::Tokenizer> tokenizer,
                                       const io::DatasetInfo& data, int64_t vocab_size,
                                       absl::string_view fix);

  // The token ids of `text`; INVALID_ARGUMENT for text outside the vocabulary.
  absl::StatusOr<std::vector<int64_t>> Encode(const std::string& text) const;

  // The text `token` adds to what was generated before it. With a tokenizer, the generated ids
  // are decoded as one text (a piece's leading space depends on its neighbours), and the part not
  // yet returned is returned.
  std::string Next(int64_t token);

 private:
  std::shared_ptr<const io::Tokenizer> tokenizer_;
  std::optional<io::ByteVocabulary> bytes_;
  std::vector<int32_t> generated_;
  size_t shown_ = 0;
};

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_TOKEN_TEXT_H_
