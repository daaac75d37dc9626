#include "common/io/digest.h"

#include <openssl/evp.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "common/io/file_util.h"

namespace pipetrain::io {

absl::StatusOr<FileDigest> DigestBytes(absl::string_view bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr) != 1 || len != 32) {
    return absl::InternalError("OpenSSL's EVP_Digest(SHA-256) failed");
  }
  FileDigest out;
  out.sha256 = absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(md), static_cast<size_t>(len)));
  out.bytes = static_cast<int64_t>(bytes.size());
  return out;
}

bool IsSha256Hex(absl::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c)) && !(c >= 'a' && c <= 'f')) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<FileDigest> DigestFile(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  return DigestBytes(*bytes);
}

}  // namespace pipetrain::io
