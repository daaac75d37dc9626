// A file descriptor closed on scope exit, and the errno -> absl::Status conversion that the file
// and directory utilities share. Internal to common/io.
#ifndef PIPETRAIN_COMMON_IO_SCOPED_FD_H_
#define PIPETRAIN_COMMON_IO_SCOPED_FD_H_

#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace pipetrain::io {

// Owns a file descriptor (or -1) and closes it on destruction. Not copyable.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Gives up ownership without closing; the caller now owns the descriptor.
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  // Closes now and returns close()'s result (errno set on failure).
  int Close() {
    int fd = fd_;
    fd_ = -1;
    return ::close(fd);
  }

 private:
  int fd_;
};

// The status for errno `err` with the message "<what> '<path>': <errno text>".
inline absl::Status ErrnoError(int err, absl::string_view what, absl::string_view path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " '", path, "'"));
}

}  // namespace pipetrain::io

#endif  // PIPETRAIN_COMMON_IO_SCOPED_FD_H_
