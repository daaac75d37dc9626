#include "common/io/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/io/file_util.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace pipetrain::io {
namespace {

using json = nlohmann::json;

constexpr bool kHostLittleEndian =
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__)
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
#else
    false;  // unknown: use the portable byte-wise path
#endif

// Deepest JSON nesting a valid header has is 3 (object > entry > shape array); anything much
// deeper is rejected before parsing so that hostile headers cannot cost deep parser stacks.
constexpr int kMaxHeaderNesting = 8;

void AppendLe64(uint64_t v, std::string* out) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t LoadLe64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

uint32_t LoadLe32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

uint16_t LoadLe16(const char* p) {
  return static_cast<uint16_t>(static_cast<unsigned char>(p[0]) |
                               (static_cast<unsigned char>(p[1]) << 8));
}

float FloatFromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint32_t BitsFromFloat(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

// Exact IEEE binary16 -> binary32 conversion (keeps infinities and NaN payload bits).
float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exactly representable as a float.
    float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 31) return FloatFromBits(sign | 0x7f800000u | (mantissa << 13));
  return FloatFromBits(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// Whether `s` is well-formed UTF-8 (no overlongs, surrogates or code points above U+10FFFF).
bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + static_cast<size_t>(len) > n) return false;
    for (int k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += static_cast<size_t>(len);
  }
  return true;
}

// Appends `s` as a JSON string literal, escaped as serde_json (the reference writer) does.
void AppendJsonString(absl::string_view s, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20) {
          out->append("\\u00");
          out->push_back(kHex[c >> 4]);
          out->push_back(kHex[c & 0xf]);
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

// Quotes a (possibly hostile) name for an error message: escaped like JSON, cut at 200 bytes.
std::string Quote(absl::string_view s) {
  std::string out;
  if (s.size() > 200) {
    AppendJsonString(s.substr(0, 200), &out);
    out.insert(out.size() - 1, "...");
  } else {
    AppendJsonString(s, &out);
  }
  return out;
}

struct DtypeInfo {
  const char* name;
  uint64_t size;
  bool supported;
};

// Every dtype of the safetensors format; the ones we can convert to float are marked supported.
constexpr DtypeInfo kDtypes[] = {
    {"F32", 4, true},      {"F16", 2, true},      {"BF16", 2, true}, {"F64", 8, true},
    {"BOOL", 1, false},    {"U8", 1, false},      {"I8", 1, false},  {"F8_E5M2", 1, false},
    {"F8_E4M3", 1, false}, {"F8_E8M0", 1, false}, {"I16", 2, false}, {"U16", 2, false},
    {"I32", 4, false},     {"U32", 4, false},     {"I64", 8, false}, {"U64", 8, false},
    {"C64", 8, false},
};

const DtypeInfo* FindDtype(absl::string_view name) {
  for (const DtypeInfo& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

// One validated header entry.
struct Entry {
  std::string name;
  const DtypeInfo* dtype = nullptr;
  std::vector<int64_t> shape;
  uint64_t elements = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Maximum nesting depth of arrays/objects in `text` (strings are skipped).
int MaxNesting(absl::string_view text) {
  int depth = 0;
  int max_depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return max_depth;
}

// Parses the header JSON, rejecting duplicate keys (which nlohmann would silently collapse).
absl::StatusOr<json> ParseHeaderJson(absl::string_view text, absl::string_view source) {
  if (MaxNesting(text) > kMaxHeaderNesting) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": header JSON is nested deeper than ", kMaxHeaderNesting, " levels"));
  }
  if (!IsValidUtf8(text)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": header is not valid UTF-8"));
  }
  std::vector<std::set<std::string>> open_objects;
  std::string top_key;
  std::string duplicate_error;
  json::parser_callback_t callback = [&](int /*depth*/, json::parse_event_t event,
                                         json& parsed) -> bool {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key: {
        if (open_objects.empty() || !parsed.is_string()) break;
        const std::string& key = parsed.get_ref<const std::string&>();
        const bool top = open_objects.size() == 1;
        if (top) top_key = key;
        if (!open_objects.back().insert(key).second && duplicate_error.empty()) {
          duplicate_error =
              top ? absl::StrCat("duplicate tensor name ", Quote(key))
                  : absl::StrCat("entry ", Quote(top_key), ": duplicate key ", Quote(key));
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  json header = json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
  if (header.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": header is not valid JSON"));
  }
  if (!duplicate_error.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", duplicate_error));
  }
  if (!header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": header is a JSON ", header.type_name(), ", not an object"));
  }
  return header;
}

// Reads a non-negative JSON integer field element.
absl::StatusOr<uint64_t> GetUnsigned(const json& v, absl::string_view what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is negative (", v.get<int64_t>(), ")"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " is a ", v.type_name(), ", not a non-negative integer"));
}

absl::StatusOr<Entry> ParseEntry(const std::string& name, const json& value, uint64_t buffer_size,
                                 absl::string_view source) {
  const std::string where = absl::StrCat(source, ": tensor ", Quote(name), ": ");
  auto invalid = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(where, what));
  };
  if (!value.is_object()) {
    return invalid(absl::StrCat("entry is a JSON ", value.type_name(), ", not an object"));
  }
  for (const auto& [key, unused] : value.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return invalid(absl::StrCat("unknown field ", Quote(key)));
    }
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(field)) return invalid(absl::StrCat("missing field \"", field, "\""));
  }
  Entry e;
  e.name = name;

  const json& dtype = value["dtype"];
  if (!dtype.is_string()) {
    return invalid(absl::StrCat("\"dtype\" is a ", dtype.type_name(), ", not a string"));
  }
  const std::string& dtype_name = dtype.get_ref<const std::string&>();
  e.dtype = FindDtype(dtype_name);
  if (e.dtype == nullptr) return invalid(absl::StrCat("unknown dtype ", Quote(dtype_name)));
  if (!e.dtype->supported) {
    return invalid(
        absl::StrCat("dtype ", dtype_name, " is not supported (supported: F32, F16, BF16, F64)"));
  }

  const json& shape = value["shape"];
  if (!shape.is_array()) {
    return invalid(absl::StrCat("\"shape\" is a ", shape.type_name(), ", not an array"));
  }
  uint64_t elements = 1;
  bool overflow = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    absl::StatusOr<uint64_t> dim = GetUnsigned(shape[i], absl::StrCat("shape[", i, "]"));
    if (!dim.ok()) return invalid(dim.status().message());
    if (*dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return invalid(absl::StrCat("shape[", i, "] = ", *dim, " is too large"));
    }
    e.shape.push_back(static_cast<int64_t>(*dim));
    overflow |= __builtin_mul_overflow(elements, *dim, &elements);
  }
  uint64_t nbytes = 0;
  if (overflow || __builtin_mul_overflow(elements, e.dtype->size, &nbytes)) {
    return invalid(absl::StrCat("shape [", absl::StrJoin(e.shape, ", "),
                                "] has more elements than fit in 64 bits"));
  }
  e.elements = elements;

  const json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    return invalid(absl::StrCat("\"data_offsets\" must be an array [begin, end], not ",
                                offsets.is_array() ? absl::StrCat("an array of ", offsets.size())
                                                   : absl::StrCat("a JSON ", offsets.type_name())));
  }
  absl::StatusOr<uint64_t> begin = GetUnsigned(offsets[0], "data_offsets[0] (begin)");
  if (!begin.ok()) return invalid(begin.status().message());
  absl::StatusOr<uint64_t> end = GetUnsigned(offsets[1], "data_offsets[1] (end)");
  if (!end.ok()) return invalid(end.status().message());
  e.begin = *begin;
  e.end = *end;
  if (e.begin > e.end) {
    return invalid(absl::StrCat("data_offsets [", e.begin, ", ", e.end, "] has begin > end"));
  }
  if (e.end - e.begin != nbytes) {
    return invalid(absl::StrCat("shape [", absl::StrJoin(e.shape, ", "), "] of ", dtype_name,
                                " needs ", nbytes, " bytes but data_offsets [", e.begin, ", ",
                                e.end, "] span ", e.end - e.begin));
  }
  if (e.end > buffer_size) {
    return absl::DataLossError(absl::StrCat(where, "data_offsets [", e.begin, ", ", e.end,
                                            "] extend past the end of the ", buffer_size,
                                            "-byte data buffer (file truncated?)"));
  }
  return e;
}

// Checks that the entries tile [0, buffer_size) exactly: no overlap, no gap, no trailing bytes.
absl::Status CheckLayout(std::vector<const Entry*> entries, uint64_t buffer_size,
                         absl::string_view source) {
  std::sort(entries.begin(), entries.end(), [](const Entry* a, const Entry* b) {
    return std::tie(a->begin, a->end, a->name) < std::tie(b->begin, b->end, b->name);
  });
  uint64_t covered = 0;  // bytes [0, covered) are owned by `last`
  const Entry* last = nullptr;
  for (const Entry* e : entries) {
    if (e->begin < covered) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": tensor ", Quote(e->name), " [", e->begin, ", ", e->end, ") overlaps tensor ",
          Quote(last->name), " [", last->begin, ", ", last->end, ")"));
    }
    if (e->begin > covered) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": bytes [", covered, ", ", e->begin, ") of the data buffer belong to no tensor",
          last != nullptr ? absl::StrCat(" (between ", Quote(last->name), " and ") : " (before ",
          Quote(e->name), ")"));
    }
    if (e->end > covered || last == nullptr) {
      covered = e->end;
      last = e;
    }
  }
  if (covered != buffer_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": the data buffer has ", buffer_size, " bytes but the tensors cover only ",
        covered, " (", buffer_size - covered, " trailing bytes",
        last != nullptr ? absl::StrCat(" after ", Quote(last->name)) : std::string(), ")"));
  }
  return absl::OkStatus();
}

math::Tensor Decode(const Entry& e, const char* data) {
  math::Tensor t;
  t.shape = e.shape;
  t.data.resize(e.elements);
  const char* p = data + e.begin;
  const absl::string_view dtype = e.dtype->name;
  if (dtype == "F32") {
    if (kHostLittleEndian) {
      if (e.elements > 0) std::memcpy(t.data.data(), p, e.elements * 4);
    } else {
      for (uint64_t i = 0; i < e.elements; ++i) t.data[i] = FloatFromBits(LoadLe32(p + 4 * i));
    }
  } else if (dtype == "F16") {
    for (uint64_t i = 0; i < e.elements; ++i) t.data[i] = HalfToFloat(LoadLe16(p + 2 * i));
  } else if (dtype == "BF16") {
    for (uint64_t i = 0; i < e.elements; ++i) {
      t.data[i] = FloatFromBits(static_cast<uint32_t>(LoadLe16(p + 2 * i)) << 16);
    }
  } else if (dtype == "F64") {
    for (uint64_t i = 0; i < e.elements; ++i) {
      const uint64_t bits = LoadLe64(p + 8 * i);
      double d;
      std::memcpy(&d, &bits, sizeof(d));
      t.data[i] = static_cast<float>(d);
    }
  }
  return t;
}

}  // namespace

absl::StatusOr<std::string> SerializeSafetensors(
    const std::map<std::string, math::Tensor>& tensors,
    const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  if (!metadata.empty()) {
    header.append("\"__metadata__\":{");
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
        return absl::InvalidArgumentError(
            absl::StrCat("metadata key ", Quote(key), ": key or value is not valid UTF-8"));
      }
      if (!first) header.push_back(',');
      first = false;
      AppendJsonString(key, &header);
      header.push_back(':');
      AppendJsonString(value, &header);
    }
    header.push_back('}');
  }
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__") {
      return absl::InvalidArgumentError("tensor name \"__metadata__\" is reserved");
    }
    if (!IsValidUtf8(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name ", Quote(name), " is not valid UTF-8"));
    }
    uint64_t elements = 1;
    for (int64_t d : tensor.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", Quote(name), ": shape [",
                                                       absl::StrJoin(tensor.shape, ", "),
                                                       "] has a negative dimension"));
      }
      if (__builtin_mul_overflow(elements, static_cast<uint64_t>(d), &elements)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor ", Quote(name), ": shape [", absl::StrJoin(tensor.shape, ", "), "] overflows"));
      }
    }
    if (elements != tensor.data.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", Quote(name), ": shape [", absl::StrJoin(tensor.shape, ", "),
                       "] has ", elements, " elements but data has ", tensor.data.size()));
    }
    if (header.size() > 1) header.push_back(',');
    AppendJsonString(name, &header);
    absl::StrAppend(&header, ":{\"dtype\":\"F32\",\"shape\":[", absl::StrJoin(tensor.shape, ","),
                    "],\"data_offsets\":[", offset, ",", offset + 4 * elements, "]}");
    offset += 4 * elements;
  }
  header.push_back('}');
  header.append((8 - header.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + header.size() + offset);
  AppendLe64(header.size(), &out);
  out.append(header);
  for (const auto& [name, tensor] : tensors) {
    if (kHostLittleEndian) {
      out.append(reinterpret_cast<const char*>(tensor.data.data()), 4 * tensor.data.size());
    } else {
      for (float f : tensor.data) {
        const uint32_t bits = BitsFromFloat(f);
        for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
      }
    }
  }
  return out;
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::map<std::string, math::Tensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  PT_ASSIGN_OR_RETURN(std::string bytes, SerializeSafetensors(tensors, metadata));
  return WriteFileAtomically(path, bytes);
}

absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view bytes,
                                                 absl::string_view source_name) {
  const std::string source = source_name.empty() ? "<safetensors>" : std::string(source_name);
  if (bytes.size() < 8) {
    return absl::DataLossError(absl::StrCat(source, ": file has ", bytes.size(),
                                            " bytes, fewer than the 8-byte header length"));
  }
  const uint64_t header_len = LoadLe64(bytes.data());
  const uint64_t after_len = bytes.size() - 8;
  if (header_len > after_len) {
    return absl::DataLossError(absl::StrCat(source, ": header length ", header_len, " exceeds the ",
                                            after_len, " bytes that follow it (file truncated?)"));
  }
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(source, ": header length ", header_len,
                                                     " exceeds the limit of ",
                                                     kMaxSafetensorsHeaderBytes, " bytes"));
  }
  const absl::string_view header_text = bytes.substr(8, header_len);
  const uint64_t buffer_size = after_len - header_len;
  const char* buffer = bytes.data() + 8 + header_len;

  PT_ASSIGN_OR_RETURN(json header, ParseHeaderJson(header_text, source));

  SafetensorsFile file;
  std::vector<Entry> entries;
  entries.reserve(header.size());
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": \"__metadata__\" is a JSON ",
                                                       value.type_name(), ", not an object"));
      }
      for (const auto& [key, v] : value.items()) {
        if (!v.is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(source, ": \"__metadata__\" value of ",
                                                         Quote(key), " is a JSON ", v.type_name(),
                                                         ", not a string"));
        }
        file.metadata.emplace(key, v.get<std::string>());
      }
      continue;
    }
    PT_ASSIGN_OR_RETURN(Entry e, ParseEntry(name, value, buffer_size, source));
    entries.push_back(std::move(e));
  }

  std::vector<const Entry*> pointers;
  pointers.reserve(entries.size());
  for (const Entry& e : entries) pointers.push_back(&e);
  PT_RETURN_IF_ERROR(CheckLayout(std::move(pointers), buffer_size, source));

  for (const Entry& e : entries) file.tensors.emplace(e.name, Decode(e, buffer));
  return file;
}

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  PT_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  return ParseSafetensors(bytes, path);
}

}  // namespace pipetrain::io
