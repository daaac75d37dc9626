// The token ids of a byte-level text data set (DatasetInfo::vocabulary): text <-> token ids.
#ifndef PIPETRAIN_COMMON_IO_BYTE_VOCABULARY_H_
#define PIPETRAIN_COMMON_IO_BYTE_VOCABULARY_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pipetrain::io {

// Token i is the i-th byte of the vocabulary string (a text data set's bytes, sorted, each once).
// Immutable after Create; thread-safe.
class ByteVocabulary {
 public:
  // INVALID_ARGUMENT if `bytes` is empty or holds a byte twice.
  static absl::StatusOr<ByteVocabulary> Create(absl::string_view bytes);

  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }

  // The token ids of `text`, byte by byte. INVALID_ARGUMENT for a byte outside the vocabulary,
  // naming it, its offset in `text` and how many bytes the vocabulary has, e.g. "byte 0xc3 ('\303')
  // at offset 4 is not in the model's vocabulary (65 bytes of its training text)".
  absl::StatusOr<std::vector<int64_t>> Encode(absl::string_view text) const;

  // The byte of token `id`, which must be in [0, size()).
  char byte(int64_t id) const { return bytes_[static_cast<size_t>(id)]; }

  // The bytes of `ids`; each must be in [0, size()) (INVALID_ARGUMENT naming it otherwise).
  absl::StatusOr<std::string> Decode(absl::Span<const int64_t> ids) const;

 private:
  explicit ByteVocabulary(std::string bytes);

  std::string bytes_;
  std::array<int16_t, 256> id_of_;  // -1: not in the vocabulary.
};

}  // namespace pipetrain::io

#endif  // PIPETRAIN_COMMON_IO_BYTE_VOCABULARY_H_
