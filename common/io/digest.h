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

// Returns the SHA-256 and size of the file at `path`, read in pieces of 1 MiB (memory does not
// grow with the file). NOT_FOUND if it does not exist, FAILED_PRECONDITION if it is a directory,
// others with the errno text and the path; INTERNAL as for DigestBytes.
absl::StatusOr<FileDigest> DigestFile(const std::string& path);

// An incremental SHA-256: the digest of every byte given to Update, in order. Not thread-safe.
class Sha256Stream {
 public:
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;

  // Adds `bytes`. INTERNAL if OpenSSL fails (then the stream is unusable).
  absl::Status Update(absl::string_view bytes);

  // The digest of everything added (64 lowercase hex digits) and its size. Call once.
  absl::StatusOr<FileDigest> Finish();

 private:
  void* ctx_;  // EVP_MD_CTX, kept out of this header.
  int64_t bytes_ = 0;
  absl::Status status_;
};

}  // namespace pipetrain::io

#endif  // PIPETRAIN_COMMON_IO_DIGEST_H_
