#include "common/io/byte_vocabulary.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pipetrain::io {
namespace {

// "0x41 ('A')" for a printable byte, "0x0a" otherwise.
std::string DescribeByte(unsigned char b) {
  if (b >= 0x20 && b < 0x7f) return absl::StrFormat("0x%02x ('%c')", b, b);
  return absl::StrFormat("0x%02x", b);
}

}  // namespace

ByteVocabulary::ByteVocabulary(std::string bytes) : bytes_(std::move(bytes)) {
  id_of_.fill(-1);
  for (size_t i = 0; i < bytes_.size(); ++i) {
    id_of_[static_cast<unsigned char>(bytes_[i])] = static_cast<int16_t>(i);
  }
}

absl::StatusOr<ByteVocabulary> ByteVocabulary::Create(absl::string_view bytes) {
  if (bytes.empty()) return absl::InvalidArgumentError("the vocabulary is empty");
  std::array<bool, 256> seen{};
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    if (seen[b]) {
      return absl::InvalidArgumentError(
          absl::StrCat("the vocabulary holds byte ", DescribeByte(b), " twice"));
    }
    seen[b] = true;
  }
  return ByteVocabulary(std::string(bytes));
}

absl::StatusOr<std::vector<int64_t>> ByteVocabulary::Encode(absl::string_view text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (id_of_[b] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "byte ", DescribeByte(b), " at offset ", i, " is not in the model's vocabulary (the ",
          bytes_.size(), " distinct bytes of its training text)"));
    }
    ids.push_back(id_of_[b]);
  }
  return ids;
}

absl::StatusOr<std::string> ByteVocabulary::Decode(absl::Span<const int64_t> ids) const {
  std::string text;
  text.reserve(ids.size());
  for (const int64_t id : ids) {
    if (id < 0 || id >= size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the vocabulary [0, ", size(), ")"));
    }
    text.push_back(bytes_[static_cast<size_t>(id)]);
  }
  return text;
}

}  // namespace pipetrain::io
