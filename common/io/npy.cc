#include "common/io/npy.h"

#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/io/input_file.h"
#include "common/util/checked_math.h"
#include "common/util/status_macros.h"

namespace pipetrain::io {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the .npy reader hands out little-endian data as it is");

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;
// Largest rank accepted (numpy's own limit is 64).
constexpr size_t kMaxRank = 32;
// Largest dimension accepted: any larger shape overflows a byte count anyway.
constexpr int64_t kMaxDimension = int64_t{1} << 62;

// The dictionary of a header: {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// followed by spaces and a newline. Recursive descent over exactly that grammar; every read is
// bounds-checked against the header text.
class HeaderParser {
 public:
  HeaderParser(absl::string_view text, absl::string_view file) : text_(text), file_(file) {}

  absl::Status Parse(NpyHeader* header) {
    SkipSpace();
    if (!Consume('{')) return Error("header is not a dictionary (no '{')");
    bool have_descr = false, have_order = false, have_shape = false;
    bool fortran_order = false;
    while (true) {
      SkipSpace();
      if (Consume('}')) break;
      PT_ASSIGN_OR_RETURN(std::string key, ParseString("a key"));
      SkipSpace();
      if (!Consume(':')) return Error(absl::StrCat("no ':' after the key '", key, "'"));
      SkipSpace();
      if (key == "descr" && !have_descr) {
        have_descr = true;
        if (Peek() == '[') {
          return Error("the dtype is structured (a list of fields); need a plain numeric dtype");
        }
        PT_ASSIGN_OR_RETURN(header->descr, ParseString("the descr value"));
      } else if (key == "fortran_order" && !have_order) {
        have_order = true;
        PT_ASSIGN_OR_RETURN(fortran_order, ParseBool());
      } else if (key == "shape" && !have_shape) {
        have_shape = true;
        PT_ASSIGN_OR_RETURN(header->shape, ParseShape());
      } else if (key == "descr" || key == "fortran_order" || key == "shape") {
        return Error(absl::StrCat("the key '", key, "' appears twice"));
      } else {
        return Error(absl::StrCat("unknown key '", absl::CHexEscape(key),
                                  "' (a .npy header has descr, fortran_order and shape)"));
      }
      SkipSpace();
      if (Consume('}')) break;
      if (!Consume(',')) return Error("expected ',' or '}' after a value");
    }
    SkipSpace();
    if (pos_ != text_.size()) return Error("text after the dictionary");
    if (!have_descr || !have_order || !have_shape) {
      return Error(absl::StrCat("the header lacks '",
                                !have_descr ? "descr" : (!have_order ? "fortran_order" : "shape"),
                                "'"));
    }
    if (fortran_order) {
      return Error(
          "fortran_order is True (a column-major array); save a C-order array: "
          "np.save(path, np.ascontiguousarray(a))");
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ": .npy header, byte ", pos_, ": ", what));
  }
  char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool Consume(char c) {
    if (Peek() != c || pos_ >= text_.size()) return false;
    ++pos_;
    return true;
  }
  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  // A Python string literal in single or double quotes, without escapes.
  absl::StatusOr<std::string> ParseString(absl::string_view what) {
    const char quote = Peek();
    if (quote != '\'' && quote != '"') return Error(absl::StrCat("expected ", what, " in quotes"));
    ++pos_;
    const size_t end = text_.find(quote, pos_);
    if (end == absl::string_view::npos) return Error("unterminated string");
    absl::string_view s = text_.substr(pos_, end - pos_);
    if (s.find('\\') != absl::string_view::npos) return Error("escape sequence in a string");
    pos_ = end + 1;
    return std::string(s);
  }

  absl::StatusOr<bool> ParseBool() {
    for (const auto& [word, value] : {std::pair<absl::string_view, bool>{"True", true},
                                      std::pair<absl::string_view, bool>{"False", false}}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    }
    return Error("fortran_order must be True or False");
  }

  // A non-negative decimal integer (Python 2's numpy may append 'L').
  absl::StatusOr<int64_t> ParseDimension() {
    const size_t begin = pos_;
    int64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const int digit = text_[pos_] - '0';
      // Checked before it can overflow: value * 10 + digit <= kMaxDimension.
      if (value > (kMaxDimension - digit) / 10) return Error("a dimension is larger than 2^62");
      value = value * 10 + digit;
      ++pos_;
    }
    if (pos_ == begin) {
      return Error(Peek() == '-' ? "a dimension is negative" : "expected a dimension");
    }
    Consume('L');
    return value;
  }

  // A tuple of dimensions: (), (3,), (3, 4) or (3, 4,).
  absl::StatusOr<std::vector<int64_t>> ParseShape() {
    if (!Consume('(')) return Error("shape must be a tuple");
    std::vector<int64_t> shape;
    while (true) {
      SkipSpace();
      if (Consume(')')) break;
      if (shape.size() == kMaxRank)
        return Error(absl::StrCat("more than ", kMaxRank, " dimensions"));
      PT_ASSIGN_OR_RETURN(int64_t d, ParseDimension());
      shape.push_back(d);
      SkipSpace();
      if (Consume(')')) {
        if (shape.size() == 1) return Error("a one-element shape needs a trailing comma: (n,)");
        break;
      }
      if (!Consume(',')) return Error("expected ',' or ')' in the shape");
    }
    return shape;
  }

  absl::string_view text_;
  absl::string_view file_;
  size_t pos_ = 0;
};

// Fills kind and item_bytes from descr, refusing what a data set cannot hold.
absl::Status CheckDescr(NpyHeader* h, absl::string_view file) {
  const std::string& d = h->descr;
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": dtype '", absl::CHexEscape(d), "' ", what));
  };
  if (d.size() < 2 || d.size() > 4) return error("is not a numeric dtype numpy writes");
  const char order = d[0];
  const char kind = d[1];
  if (order != '<' && order != '>' && order != '|' && order != '=') {
    return error("has no byte order ('<', '>', '|' or '=')");
  }
  if (kind == 'O') return error("is an object array (pickled Python objects); need numbers");
  if (kind == 'U' || kind == 'S' || kind == 'a') return error("holds strings; need numbers");
  int64_t size = 0;
  for (size_t i = 2; i < d.size(); ++i) {
    if (d[i] < '0' || d[i] > '9') return error("is not a numeric dtype numpy writes");
    size = size * 10 + (d[i] - '0');
  }
  const bool known =
      (kind == 'f' && (size == 2 || size == 4 || size == 8)) ||
      ((kind == 'i' || kind == 'u') && (size == 1 || size == 2 || size == 4 || size == 8)) ||
      (kind == 'b' && size == 1);
  if (!known) return error("is not a supported number type (float, int, uint or bool)");
  if (order == '>' && size > 1) {
    return error(absl::StrCat("is big-endian; save it little-endian: a.astype('<",
                              std::string(1, kind), size, "')"));
  }
  if (order == '|' && size > 1) return error("has no byte order but more than one byte");
  h->kind = kind;
  h->item_bytes = size;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view bytes, absl::string_view file) {
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", what));
  };
  if (bytes.size() < kMagicBytes + 2 || std::memcmp(bytes.data(), kMagic, kMagicBytes) != 0) {
    return error("not a .npy file (it does not start with \\x93NUMPY)");
  }
  NpyHeader h;
  h.major_version = static_cast<unsigned char>(bytes[6]);
  h.minor_version = static_cast<unsigned char>(bytes[7]);
  if (h.major_version < 1 || h.major_version > 3 || h.minor_version != 0) {
    return error(absl::StrCat(".npy format version ", h.major_version, ".", h.minor_version,
                              " is not one of 1.0, 2.0 and 3.0"));
  }
  const size_t length_bytes = h.major_version == 1 ? 2 : 4;
  if (bytes.size() < kMagicBytes + 2 + length_bytes) return error("the header is truncated");
  uint64_t header_len = 0;
  for (size_t i = 0; i < length_bytes; ++i) {
    header_len |= uint64_t{static_cast<unsigned char>(bytes[8 + i])} << (8 * i);
  }
  if (header_len > static_cast<uint64_t>(kMaxNpyHeaderBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": .npy header of ", header_len,
                                                   " bytes is longer than the limit of ",
                                                   kMaxNpyHeaderBytes));
  }
  const size_t header_begin = kMagicBytes + 2 + length_bytes;
  if (bytes.size() - header_begin < header_len) {
    return error(absl::StrCat("the header is truncated: it says ", header_len,
                              " bytes, the file has ", bytes.size() - header_begin,
                              " after the length field"));
  }
  HeaderParser parser(bytes.substr(header_begin, header_len), file);
  PT_RETURN_IF_ERROR(parser.Parse(&h));
  PT_RETURN_IF_ERROR(CheckDescr(&h, file));
  h.data_offset = static_cast<int64_t>(header_begin + header_len);
  std::optional<int64_t> elements = 1;
  for (int64_t d : h.shape) {
    if (elements.has_value()) elements = util::CheckedMul(*elements, d);
  }
  std::optional<int64_t> data_bytes =
      elements.has_value() ? util::CheckedMul(*elements, h.item_bytes) : std::nullopt;
  if (!data_bytes.has_value()) return error("the shape's byte size overflows 64 bits");
  h.elements = *elements;
  const int64_t have = static_cast<int64_t>(bytes.size()) - h.data_offset;
  if (have != *data_bytes) {
    return error(absl::StrCat("the shape (", absl::StrJoin(h.shape, ", "), ") of ", NpyDtypeName(h),
                              " needs ", *data_bytes, " data bytes, the file has ", have,
                              have < *data_bytes ? " (truncated)" : " (trailing bytes)"));
  }
  return h;
}

std::string NpyDtypeName(const NpyHeader& header) {
  switch (header.kind) {
    case 'f':
      return absl::StrCat("float", 8 * header.item_bytes);
    case 'i':
      return absl::StrCat("int", 8 * header.item_bytes);
    case 'u':
      return absl::StrCat("uint", 8 * header.item_bytes);
    case 'b':
      return "bool";
    default:
      return absl::StrCat("'", absl::CHexEscape(header.descr), "'");
  }
}

absl::StatusOr<NpyFile> ReadNpyFile(const std::string& path, int64_t max_bytes) {
  NpyFile f;
  PT_ASSIGN_OR_RETURN(f.bytes,
                      ReadInputFile("data file", path, max_bytes, InputCompression::kNone));
  PT_ASSIGN_OR_RETURN(f.header, ParseNpyHeader(f.bytes, path));
  return f;
}

}  // namespace pipetrain::io
