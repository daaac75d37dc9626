// NumPy .npy files (format versions 1.0, 2.0 and 3.0, as numpy.save writes them): the header
// parser, which reads untrusted bytes (tests/fuzz/npy_fuzzer.cc fuzzes it), and a reader of a
// whole file. The format: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
// Only what a data set holds is accepted: little-endian (or one-byte) numbers in C order;
// big-endian, Fortran-order, object, structured and string arrays are refused with a message that
// says so.
#ifndef PIPETRAIN_COMMON_IO_NPY_H_
#define PIPETRAIN_COMMON_IO_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain::io {

// Longest header (the dictionary after the length field) ParseNpyHeader accepts. numpy writes
// about 128 bytes for the arrays a data set holds; numpy.load itself refuses more than 10,000.
inline constexpr int64_t kMaxNpyHeaderBytes = 65536;

// The parsed header of a .npy file.
struct NpyHeader {
  int major_version = 0;       // 1, 2 or 3
  int minor_version = 0;       // 0
  std::string descr;           // the dtype as written, e.g. "<f4"
  char kind = 0;               // 'f' float, 'i' signed integer, 'u' unsigned integer, 'b' boolean
  int64_t item_bytes = 0;      // bytes per element (4 for "<f4")
  std::vector<int64_t> shape;  // empty for a 0-d array
  int64_t elements = 0;        // product of shape (1 for a 0-d array)
  int64_t data_offset = 0;     // offset of the first data byte in the file
};

// Parses the header of the .npy file whose complete contents are `bytes` (`file` names it in
// messages) and checks that exactly elements x item_bytes data bytes follow it. Never reads
// outside `bytes`; thread-safe. INVALID_ARGUMENT "FILE: <what>" for anything else: not an .npy
// file (the magic bytes), an unknown version, a header that is not the dictionary numpy writes
// ({'descr': ..., 'fortran_order': ..., 'shape': (...)}, each key once) or is longer than
// kMaxNpyHeaderBytes, a big-endian dtype ("'>f4' is big-endian; save it little-endian:
// a.astype('<f4')"), fortran_order True, an object ('|O'), structured, string or unknown dtype, a
// negative dimension or a shape whose byte size overflows, and a data size that differs from the
// shape's (truncated file or trailing bytes).
absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view bytes, absl::string_view file);

// NumPy's name of the header's dtype, for messages: "float32", "int64", "uint16", "bool", ...
std::string NpyDtypeName(const NpyHeader& header);

// A whole .npy file in memory: its header and its bytes (the data starts at
// header.data_offset).
struct NpyFile {
  NpyHeader header;
  std::string bytes;
};

// Reads and parses the .npy file at `path` (a regular file of at most `max_bytes` bytes, not
// compressed). Errors: those of ReadInputFile (NOT_FOUND, INVALID_ARGUMENT for a directory or a
// device, RESOURCE_EXHAUSTED beyond `max_bytes`) and of ParseNpyHeader. Thread-safe.
absl::StatusOr<NpyFile> ReadNpyFile(const std::string& path, int64_t max_bytes);

}  // namespace pipetrain::io

#endif  // PIPETRAIN_COMMON_IO_NPY_H_
