// Reading and writing the safetensors format (https://github.com/huggingface/safetensors).
//
// Layout: an 8-byte little-endian u64 N, then N bytes of UTF-8 JSON header, then the data buffer.
// The header is an object mapping each tensor name to
//   {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}
// (offsets in bytes, relative to the start of the data buffer) plus an optional
// "__metadata__": {"key": "string value", ...}. Tensor data is row-major little-endian.
//
// Writing produces deterministic bytes, compatible with the reference implementation: F32 only,
// tensors in name order both in the header and in the buffer, "__metadata__" first (omitted when
// empty), keys of each entry in the order dtype, shape, data_offsets, JSON without whitespace,
// then padded with spaces so that N is a multiple of 8.
//
// Reading validates the whole header before touching data. Error codes:
//   DATA_LOSS         bytes the file promises are missing: shorter than 8 bytes, header length
//                     beyond the end of the file, a tensor extending past the end of the buffer.
//   INVALID_ARGUMENT  the header is not valid UTF-8 JSON or not an object; an entry is missing a
//                     field, has an unknown field or a field of the wrong type; unknown or
//                     unsupported dtype; a dimension that is not a non-negative integer or a shape
//                     whose size overflows; shape x dtype size != end - begin; begin > end;
//                     tensors overlapping; bytes of the buffer covered by no tensor (gaps or
//                     trailing bytes); duplicate keys; non-string "__metadata__" values.
//   RESOURCE_EXHAUSTED a header longer than kMaxSafetensorsHeaderBytes.
// Every message starts with the source name and names the offending tensor where there is one.
// Dtypes read: F32 (bit-exact, NaN payloads kept), F16 and BF16 (converted exactly to float) and
// F64 (rounded to the nearest float). Other dtypes of the format are INVALID_ARGUMENT.
//
// All functions are thread-safe.
#ifndef PIPETRAIN_COMMON_IO_SAFETENSORS_H_
#define PIPETRAIN_COMMON_IO_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/math/tensor.h"

namespace pipetrain::io {

// Largest JSON header accepted by the reader (the reference implementation's limit).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// The contents of one safetensors file.
struct SafetensorsFile {
  std::map<std::string, math::Tensor> tensors;
  std::map<std::string, std::string> metadata;  // the "__metadata__" object
};

// Returns the safetensors encoding of `tensors` (all written as F32) and `metadata`.
// INVALID_ARGUMENT naming the tensor if a shape has a negative dimension or its element count
// differs from data.size(), if a name is "__metadata__", or if a name, key or value is not
// valid UTF-8.
absl::StatusOr<std::string> SerializeSafetensors(
    const std::map<std::string, math::Tensor>& tensors,
    const std::map<std::string, std::string>& metadata);

// SerializeSafetensors, then WriteFileAtomically to `path` (see file_util.h for its errors).
absl::Status WriteSafetensors(const std::string& path,
                              const std::map<std::string, math::Tensor>& tensors,
                              const std::map<std::string, std::string>& metadata);

// Parses a complete safetensors file held in `bytes`. `source_name` (usually the path) prefixes
// every error message. Errors as described at the top of this file.
absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view bytes,
                                                 absl::string_view source_name);

// Reads `path` (ReadFile errors, e.g. NOT_FOUND) and parses it with ParseSafetensors.
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);

}  // namespace pipetrain::io

#endif  // PIPETRAIN_COMMON_IO_SAFETENSORS_H_
