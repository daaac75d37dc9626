#include "common/io/dir_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/io/file_util.h"
#include "common/io/scoped_fd.h"
#include "common/util/status_macros.h"

namespace pipetrain::io {
namespace {

constexpr absl::string_view kStagingInfix = ".tmp-";
constexpr size_t kStagingRandomDigits = 16;

// `path` without trailing slashes ("/" stays "/").
std::string StripTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// INVALID_ARGUMENT unless `dir` names a directory that can have a sibling.
absl::Status CheckStageable(const std::string& dir) {
  const size_t slash = dir.find_last_of('/');
  const std::string base = slash == std::string::npos ? dir : dir.substr(slash + 1);
  if (base.empty() || base == "." || base == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat("'", dir, "' does not name a directory that can be staged beside"));
  }
  return absl::OkStatus();
}

// A staging name beside `dir` ("<dir>.tmp-<pid>-<16 hex digits>") not used before with high
// probability; uniqueness is settled by the exclusive mkdir / rename that uses it.
std::string StagingNameFor(const std::string& dir) {
  std::random_device rd;
  const uint64_t r = (uint64_t{rd()} << 32) ^ rd();
  return absl::StrFormat("%s%s%d-%016x", dir, kStagingInfix, ::getpid(), r);
}

bool IsUnsupportedRenameFlag(int err) {
  return err == EINVAL || err == ENOSYS || err == EOPNOTSUPP;
}

absl::Status RenameError(int err, const std::string& from, const std::string& to) {
  return ErrnoError(err, absl::StrCat("cannot rename '", from, "' to"), to);
}

// Renames `from` to `to` unless `to` exists (EEXIST then). Uses RENAME_NOREPLACE; on a file
// system without it, checks for `to` first (racy, but only against other writers of `to`).
int RenameNoReplace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (!IsUnsupportedRenameFlag(errno)) return -1;
  struct stat st;
  if (::lstat(to.c_str(), &st) == 0) {
    errno = EEXIST;
    return -1;
  }
  if (errno != ENOENT) return -1;
  return ::rename(from.c_str(), to.c_str());
}

}  // namespace

absl::Status SyncDirectory(const std::string& path) {
  PT_RETURN_IF_ERROR(CheckNoNulByte(path));

  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open directory", path);
  ScopedFd closer(fd);
  if (::fsync(fd) != 0) return ErrnoError(errno, "cannot fsync directory", path);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& path) {
  PT_RETURN_IF_ERROR(CheckNoNulByte(path));

  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return ErrnoError(errno, "cannot open directory", path);
  std::vector<std::string> names;
  int err = 0;
  while (true) {
    errno = 0;
    const struct dirent* e = ::readdir(d);
    if (e == nullptr) {
      err = errno;
      break;
    }
    const absl::string_view name(e->d_name);
    if (name != "." && name != "..") names.emplace_back(name);
  }
  ::closedir(d);
  if (err != 0) return ErrnoError(err, "cannot read directory", path);
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status RemoveTree(const std::string& path) {
  PT_RETURN_IF_ERROR(CheckNoNulByte(path));

  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return ErrnoError(ec.value(), "cannot remove", path);
  return absl::OkStatus();
}

absl::StatusOr<std::string> CreateStagingDirectory(const std::string& dir_in) {
  PT_RETURN_IF_ERROR(CheckNoNulByte(dir_in));

  const std::string dir = StripTrailingSlashes(dir_in);
  PT_RETURN_IF_ERROR(CheckStageable(dir));
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string staging = StagingNameFor(dir);
    if (::mkdir(staging.c_str(), 0777) == 0) return staging;
    if (errno != EEXIST && errno != EINTR) {
      return ErrnoError(errno, "cannot create staging directory", staging);
    }
  }
  return ErrnoError(EEXIST, "cannot create a staging directory beside", dir);
}

std::string StagingTarget(absl::string_view name) {
  const size_t infix = name.rfind(kStagingInfix);
  if (infix == absl::string_view::npos || infix == 0) return "";
  absl::string_view rest = name.substr(infix + kStagingInfix.size());
  const size_t dash = rest.find('-');
  if (dash == absl::string_view::npos || dash == 0) return "";
  const absl::string_view pid = rest.substr(0, dash);
  const absl::string_view random = rest.substr(dash + 1);
  if (!std::all_of(pid.begin(), pid.end(), [](char c) { return absl::ascii_isdigit(c); }) ||
      random.size() != kStagingRandomDigits ||
      !std::all_of(random.begin(), random.end(), [](char c) { return absl::ascii_isxdigit(c); })) {
    return "";
  }
  return std::string(name.substr(0, infix));
}

absl::Status PublishDirectory(const std::string& staging, const std::string& dir_in,
                              const std::string& keep_old_as) {
  PT_RETURN_IF_ERROR(CheckNoNulByte(staging));
  PT_RETURN_IF_ERROR(CheckNoNulByte(dir_in));
  const std::string dir = StripTrailingSlashes(dir_in);
  PT_RETURN_IF_ERROR(CheckStageable(dir));
  PT_RETURN_IF_ERROR(SyncDirectory(staging));
  bool exchanged = false;
  if (RenameNoReplace(staging, dir) != 0) {
    if (errno != EEXIST && errno != ENOTEMPTY) return RenameError(errno, staging, dir);
    struct stat st;
    if (::lstat(dir.c_str(), &st) != 0) return ErrnoError(errno, "cannot stat", dir);
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", dir, "' exists and is not a directory"));
    }
    if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0) {
      const int err = errno;
      if (IsUnsupportedRenameFlag(err)) {
        return absl::FailedPreconditionError(
            absl::StrCat("cannot replace '", dir, "' atomically: its file system does not support ",
                         "renameat2(RENAME_EXCHANGE) (", std::strerror(err),
                         "); write into a directory that does not exist yet"));
      }
      return RenameError(err, staging, dir);
    }
    exchanged = true;
  }
  PT_RETURN_IF_ERROR(SyncDirectory(DirName(dir)));
  // The old contents, now at `staging`: kept if asked, else removed (a leftover is a stale
  // staging directory, documented).
  if (exchanged && !keep_old_as.empty()) {
    const std::string keep = StripTrailingSlashes(keep_old_as);
    if (RemoveDirectoryAtomically(keep).ok() && RenameNoReplace(staging, keep) == 0 &&
        SyncDirectory(DirName(keep)).ok()) {
      return absl::OkStatus();
    }
  }
  if (exchanged) RemoveTree(staging).IgnoreError();
  return absl::OkStatus();
}

absl::Status RemoveDirectoryAtomically(const std::string& path_in) {
  PT_RETURN_IF_ERROR(CheckNoNulByte(path_in));

  const std::string path = StripTrailingSlashes(path_in);
  PT_RETURN_IF_ERROR(CheckStageable(path));
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoError(errno, "cannot stat", path);
  }
  std::string doomed;
  for (int attempt = 0;; ++attempt) {
    doomed = StagingNameFor(path);
    if (RenameNoReplace(path, doomed) == 0) break;
    if ((errno != EEXIST && errno != ENOTEMPTY) || attempt == 99) {
      return RenameError(errno, path, doomed);
    }
  }
  PT_RETURN_IF_ERROR(SyncDirectory(DirName(path)));
  return RemoveTree(doomed);
}

absl::Status CheckWritableDirectory(const std::string& path) {
  PT_RETURN_IF_ERROR(CheckNoNulByte(path));

  PT_RETURN_IF_ERROR(EnsureDirectory(path));
  std::random_device rd;
  const std::string probe =
      JoinPath(path, absl::StrFormat(".pipetrain-probe.%d.%08x", ::getpid(), rd()));
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError(errno, "cannot create a file in directory", path);
  ScopedFd closer(fd);
  if (closer.Close() != 0) {
    const int err = errno;
    ::unlink(probe.c_str());
    return ErrnoError(err, "cannot close a file in directory", path);
  }
  if (::unlink(probe.c_str()) != 0) {
    return ErrnoError(errno, "cannot remove a file from directory", path);
  }
  return absl::OkStatus();
}

}  // namespace pipetrain::io
