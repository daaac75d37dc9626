// Writes .npy files byte for byte as numpy.save does (a header padded with spaces to a multiple of
// 64 bytes, ending in a newline), for the tests of the .npy reader and the npy: data sets.
#ifndef PIPETRAIN_TESTS_COMMON_IO_NPY_TEST_UTIL_H_
#define PIPETRAIN_TESTS_COMMON_IO_NPY_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace pipetrain::testing {

// The .npy bytes of `data` with the header dictionary `dict` (as written, e.g.
// "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"), format version `major`.0.
inline std::string NpyWithHeader(const std::string& dict, const std::string& data, int major = 1) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  const size_t total = prefix + header.size() + 1;
  header += std::string((64 - total % 64) % 64, ' ') + "\n";
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  const size_t length_bytes = major == 1 ? 2 : 4;
  for (size_t i = 0; i < length_bytes; ++i) {
    out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  }
  return out + header + data;
}

// The .npy bytes of an array of dtype `descr` and shape `shape` (Python tuple text, "(2, 3)").
inline std::string Npy(const std::string& descr, const std::string& shape, const std::string& data,
                       int major = 1) {
  return NpyWithHeader(
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }", data, major);
}

// The raw little-endian bytes of `values`.
template <typename T>
std::string Bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// Writes `contents` to `path`.
inline void WriteBytes(const std::string& path, const std::string& contents) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << contents;
}

}  // namespace pipetrain::testing

#endif  // PIPETRAIN_TESTS_COMMON_IO_NPY_TEST_UTIL_H_
