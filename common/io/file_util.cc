#include "common/io/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/io/dir_util.h"
#include "common/io/scoped_fd.h"

namespace pipetrain::io {
namespace {

absl::Status WriteAll(int fd, absl::string_view contents, const std::string& path) {
  const char* p = contents.data();
  size_t left = contents.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot write", path);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// A file name in the directory of `path` that no other writer (thread or process) uses.
std::string TempPathFor(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t process_random = std::random_device{}();
  return absl::StrCat(path, ".tmp.", ::getpid(), ".", process_random % 1000000, ".",
                      counter.fetch_add(1));
}

}  // namespace

absl::Status CheckNoNulByte(absl::string_view path) {
  if (path.find('\0') == absl::string_view::npos) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("path contains a NUL byte: '", absl::CEscape(path), "'"));
}

std::string DirName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  size_t end = slash;
  while (end > 0 && path[end - 1] == '/') --end;
  if (end == 0) return "/";
  return path.substr(0, end);
}

std::string JoinPath(absl::string_view a, absl::string_view b) {
  if (a.empty()) return std::string(b);
  while (!b.empty() && b.front() == '/') b.remove_prefix(1);
  if (a.back() == '/') return absl::StrCat(a, b);
  return absl::StrCat(a, "/", b);
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  if (absl::Status s = CheckNoNulByte(path); !s.ok()) return s;
  if (path.empty() || path.back() == '/') {
    return absl::InvalidArgumentError(absl::StrCat("not a file path: '", path, "'"));
  }
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    tmp = TempPathFor(path);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST && errno != EINTR) {
      return ErrnoError(errno, "cannot create temporary file", tmp);
    }
  }
  if (fd < 0) return ErrnoError(EEXIST, "cannot create temporary file", tmp);

  ScopedFd closer(fd);
  absl::Status status = WriteAll(fd, contents, tmp);
  if (status.ok() && ::fsync(fd) != 0) status = ErrnoError(errno, "cannot fsync", tmp);
  if (closer.Close() != 0 && status.ok()) status = ErrnoError(errno, "cannot close", tmp);
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = ErrnoError(errno, absl::StrCat("cannot rename '", tmp, "' to"), path);
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }

  // Make the rename itself durable.
  return SyncDirectory(DirName(path));
}

absl::StatusOr<std::string> ReadFile(const std::string& path, int64_t max_bytes) {
  if (absl::Status s = CheckNoNulByte(path); !s.ok()) return s;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open", path);
  ScopedFd closer(fd);
  return ReadOpenFile(fd, path, max_bytes);
}

absl::StatusOr<std::string> ReadOpenFile(int fd, const std::string& path, int64_t max_bytes) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(errno, "cannot stat", path);
  if (S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("'", path, "' is a directory"));
  }
  if (st.st_size > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("'", path, "' has ", st.st_size,
                                                     " bytes, more than the limit of ", max_bytes));
  }
  std::string out;
  if (S_ISREG(st.st_mode)) out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot read", path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (static_cast<int64_t>(out.size()) > max_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("'", path, "' is larger than the limit of ", max_bytes, " bytes"));
    }
  }
  return out;
}

absl::StatusOr<std::string> ReadFileMaybeGzipped(const std::string& path, int64_t max_bytes) {
  absl::StatusOr<std::string> raw = ReadFile(path, max_bytes);
  if (!raw.ok()) return raw.status();
  const std::string& in = *raw;
  if (in.size() < 2 || static_cast<unsigned char>(in[0]) != 0x1f ||
      static_cast<unsigned char>(in[1]) != 0x8b) {
    return raw;
  }

  std::string out;
  z_stream zs;
  std::memset(&zs, 0, sizeof(zs));
  // 16 + MAX_WBITS: expect a gzip wrapper.
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) {
    return absl::InternalError(absl::StrCat("zlib inflateInit2 failed for '", path, "'"));
  }
  if (in.size() > static_cast<size_t>(UINT32_MAX)) {
    inflateEnd(&zs);
    return absl::ResourceExhaustedError(
        absl::StrCat("compressed file '", path, "' is larger than 4 GiB"));
  }
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  char buf[1 << 16];
  absl::Status status;
  while (true) {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof(buf);
    int rc = inflate(&zs, Z_NO_FLUSH);
    out.append(buf, sizeof(buf) - zs.avail_out);
    if (static_cast<int64_t>(out.size()) > max_bytes) {
      status = absl::ResourceExhaustedError(absl::StrCat(
          "decompressed '", path, "' is larger than the limit of ", max_bytes, " bytes"));
      break;
    }
    if (rc == Z_STREAM_END) {
      if (zs.avail_in == 0) break;
      // Another gzip member follows (as `cat a.gz b.gz` produces).
      if (inflateReset(&zs) != Z_OK) {
        status = absl::InternalError(absl::StrCat("zlib inflateReset failed for '", path, "'"));
        break;
      }
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && zs.avail_in == 0) {
      status = absl::DataLossError(absl::StrCat("gzip file '", path, "' is truncated (after ",
                                                out.size(), " decompressed bytes)"));
    } else {
      status = absl::DataLossError(absl::StrCat(
          "gzip file '", path, "' is corrupt: ", zs.msg != nullptr ? zs.msg : "zlib error ",
          zs.msg != nullptr ? "" : std::to_string(rc)));
    }
    break;
  }
  inflateEnd(&zs);
  if (!status.ok()) return status;
  return out;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::Status EnsureDirectory(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("empty directory path");
  if (absl::Status s = CheckNoNulByte(path); !s.ok()) return s;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("'", path, "' exists and is not a directory"));
  }
  if (errno != ENOENT) return ErrnoError(errno, "cannot stat", path);
  const std::string parent = DirName(path);
  if (parent != path && parent != "." && parent != "/") {
    absl::Status s = EnsureDirectory(parent);
    if (!s.ok()) return s;
  }
  if (::mkdir(path.c_str(), 0777) != 0 && errno != EEXIST) {
    return ErrnoError(errno, "cannot create directory", path);
  }
  if (::stat(path.c_str(), &st) != 0) return ErrnoError(errno, "cannot stat", path);
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", path, "' exists and is not a directory"));
  }
  return absl::OkStatus();
}

}  // namespace pipetrain::io
