#include "common/io/confined_path.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/io/file_util.h"
#include "common/io/scoped_fd.h"

namespace pipetrain::io {
namespace {

// Lexically normalised absolute path ("/a/./b/../c" -> "/a/c"); false if ".." climbs above "/".
bool Normalise(const std::string& absolute, std::string* out) {
  std::vector<std::string> parts;
  for (absl::string_view p : absl::StrSplit(absolute, '/', absl::SkipEmpty())) {
    if (p == ".") continue;
    if (p == "..") {
      if (parts.empty()) return false;
      parts.pop_back();
      continue;
    }
    parts.emplace_back(p);
  }
  *out = "/" + absl::StrJoin(parts, "/");
  return true;
}

bool Under(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

// realpath of the longest existing prefix of `path`, with the rest appended.
std::string ResolveExisting(const std::string& path) {
  std::string prefix = path;
  std::string rest;
  for (;;) {
    char buf[PATH_MAX];
    if (realpath(prefix.c_str(), buf) != nullptr) {
      std::string resolved = buf;
      if (rest.empty()) return resolved;
      return resolved == "/" ? "/" + rest : resolved + "/" + rest;
    }
    const size_t slash = prefix.rfind('/');
    if (slash == std::string::npos || prefix == "/") return path;
    rest = rest.empty() ? prefix.substr(slash + 1) : prefix.substr(slash + 1) + "/" + rest;
    prefix = slash == 0 ? "/" : prefix.substr(0, slash);
  }
}

}  // namespace

absl::StatusOr<std::string> ConfinePath(const std::string& root, const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("empty path");
  if (absl::Status s = CheckNoNulByte(root); !s.ok()) return s;
  if (absl::Status s = CheckNoNulByte(path); !s.ok()) return s;
  char buf[PATH_MAX];
  struct stat st;
  if (root.empty() || realpath(root.c_str(), buf) == nullptr || stat(buf, &st) != 0 ||
      !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the root '", root, "' is not an existing directory"));
  }
  const std::string real_root = buf;
  std::string given_root;  // as configured (it may be a symbolic link to real_root).
  if (root[0] != '/' || !Normalise(root, &given_root)) given_root = real_root;
  std::string normal;
  const std::string absolute = path[0] == '/' ? path : real_root + "/" + path;
  if (!Normalise(absolute, &normal) || !(Under(normal, real_root) || Under(normal, given_root)) ||
      !Under(ResolveExisting(normal), real_root)) {
    return absl::PermissionDeniedError(
        absl::StrCat("'", path, "' is outside the checkpoint root ", real_root));
  }
  return normal;
}

namespace {

// realpath of `path`, or the errno error naming it.
absl::StatusOr<std::string> RealPath(const std::string& path) {
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) == nullptr) return ErrnoError(errno, "cannot resolve", path);
  return std::string(buf);
}

absl::Status LeadsOutside(const std::string& path, const std::string& target,
                          const std::string& real_dir) {
  return absl::PermissionDeniedError(absl::StrCat("'", path, "' leads to '", target,
                                                  "', outside the directory ", real_dir,
                                                  " (a symbolic link may not lead out of it)"));
}

}  // namespace

absl::StatusOr<int> OpenConfinedFile(const std::string& dir, const std::string& name) {
  const std::string path = JoinPath(dir, name);
  if (absl::Status s = CheckNoNulByte(path); !s.ok()) return s;
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name, "' is not a plain file name inside '", dir, "'"));
  }
  absl::StatusOr<std::string> real_dir = RealPath(dir);
  if (!real_dir.ok()) return real_dir.status();
  constexpr int kFlags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
  int fd = ::open(path.c_str(), kFlags);
  if (fd < 0 && errno == ELOOP) {
    // `name` is a symbolic link: follow it only to a file under the directory.
    absl::StatusOr<std::string> target = RealPath(path);
    if (!target.ok()) return target.status();
    if (!Under(*target, *real_dir)) {
      return LeadsOutside(path, *target, *real_dir);
    }
    fd = ::open(target->c_str(), kFlags);
  }
  if (fd < 0) return ErrnoError(errno, "cannot open", path);
  ScopedFd closer(fd);
  // What was opened, whatever changed on the way (a component swapped for a link).
  char buf[PATH_MAX];
  const std::string self = absl::StrCat("/proc/self/fd/", fd);
  const ssize_t n = ::readlink(self.c_str(), buf, sizeof(buf) - 1);
  if (n > 0) {
    const std::string opened(buf, static_cast<size_t>(n));
    if (!Under(opened, *real_dir)) {
      return LeadsOutside(path, opened, *real_dir);
    }
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(errno, "cannot stat", path);
  if (S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("'", path, "' is a directory"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a regular file"));
  }
  // Regular files ignore O_NONBLOCK; clear it anyway so the caller gets an ordinary descriptor.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  const int out = fd;
  closer.Release();
  return out;
}

absl::StatusOr<std::string> ReadConfinedFile(const std::string& dir, const std::string& name,
                                             int64_t max_bytes) {
  absl::StatusOr<int> fd = OpenConfinedFile(dir, name);
  if (!fd.ok()) return fd.status();
  ScopedFd closer(*fd);
  return ReadOpenFile(*fd, JoinPath(dir, name), max_bytes);
}

}  // namespace pipetrain::io
