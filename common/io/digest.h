// SHA-256 digests of byte strings and files (OpenSSL's EVP API), as lowercase hex.
//
// All functions are thread-safe (they share no state).
#ifndef PIPETRAIN_COMMON_IO_DIGEST_H_
#define PIPETRAIN_COMMON_IO_DIGEST_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain::io {

// The SHA-256 and the size of a file's contents.
struct FileDigest {
  std::string sha256;  // 64 lowercase hex digits.
  int64_t bytes = 0;
};

// Returns the SHA-256 and size of `bytes`. INTERNAL if OpenSSL fails (out of memory, or a
// provider configuration without SHA-256).
absl::StatusOr<FileDigest> DigestBytes(absl::string_view bytes);

// True if `s` is 64 lowercase hex digits, the form of FileDigest::sha256.
bool IsSha256Hex(absl::string_view s);

// Reads the whole file at `path` into memory and returns its SHA-256 and size. ReadFile's errors
// (NOT_FOUND if it does not exist, FAILED_PRECONDITION if it is a directory, others with the errno
// text and the path); INTERNAL as for DigestBytes.
absl::StatusOr<FileDigest> DigestFile(const std::string& path);

}  // namespace pipetrain::io

#endif  // PIPETRAIN_COMMON_IO_DIGEST_H_
