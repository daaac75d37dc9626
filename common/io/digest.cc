#include "common/io/digest.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
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
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    std::string what = absl::StrCat(path, ": ", strerror(err));
    return err == ENOENT ? absl::NotFoundError(what) : absl::UnavailableError(what);
  }
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, " is a directory"));
  }
  Sha256Stream digest;
  std::string buffer(size_t{1} << 20, '\0');
  absl::Status status;
  for (;;) {
    const ssize_t n = read(fd, buffer.data(), buffer.size());
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      status = absl::UnavailableError(absl::StrCat("reading ", path, ": ", strerror(errno)));
      break;
    }
    status = digest.Update(absl::string_view(buffer.data(), static_cast<size_t>(n)));
    if (!status.ok()) break;
  }
  close(fd);
  if (!status.ok()) return status;
  return digest.Finish();
}

Sha256Stream::Sha256Stream() : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ == nullptr ||
      EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) != 1) {
    status_ = absl::InternalError("OpenSSL's EVP_DigestInit_ex(SHA-256) failed");
  }
}

Sha256Stream::~Sha256Stream() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

absl::Status Sha256Stream::Update(absl::string_view bytes) {
  if (!status_.ok()) return status_;
  if (EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), bytes.data(), bytes.size()) != 1) {
    status_ = absl::InternalError("OpenSSL's EVP_DigestUpdate(SHA-256) failed");
    return status_;
  }
  bytes_ += static_cast<int64_t>(bytes.size());
  return absl::OkStatus();
}

absl::StatusOr<FileDigest> Sha256Stream::Finish() {
  if (!status_.ok()) return status_;
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), md, &len) != 1 || len != 32) {
    status_ = absl::InternalError("OpenSSL's EVP_DigestFinal_ex(SHA-256) failed");
    return status_;
  }
  status_ = absl::FailedPreconditionError("Sha256Stream::Finish called twice");
  FileDigest out;
  out.sha256 = absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(md), static_cast<size_t>(len)));
  out.bytes = bytes_;
  return out;
}

}  // namespace pipetrain::io
