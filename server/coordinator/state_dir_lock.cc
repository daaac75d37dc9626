#include "server/coordinator/state_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/io/file_util.h"
#include "common/io/scoped_fd.h"
#include "common/util/status_macros.h"

namespace pipetrain::coordinator {
namespace {

// The holder record is a few short lines; more is not ours.
constexpr size_t kMaxHolderRecordBytes = 4096;

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

// "pid P\nhost H\naddress A\n" for this process (newlines in `address` flattened).
std::string HolderRecord(const std::string& address) {
  return absl::StrCat("pid ", ::getpid(), "\nhost ", HostName(), "\naddress ",
                      absl::StrReplaceAll(address, {{"\n", " "}}), "\n");
}

// Replaces the contents of the open file `fd` with `record`.
absl::Status WriteRecord(int fd, const std::string& path, const std::string& record) {
  if (::ftruncate(fd, 0) != 0) return io::ErrnoError(errno, "cannot truncate", path);
  size_t done = 0;
  while (done < record.size()) {
    const ssize_t n =
        ::pwrite(fd, record.data() + done, record.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return io::ErrnoError(n < 0 ? errno : EIO, "cannot write", path);
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// "pid P on host H, serving on A" from the holder record in `path` (what it can read of it).
std::string DescribeHolder(const std::string& path) {
  absl::StatusOr<std::string> record = io::ReadFile(path, kMaxHolderRecordBytes);
  if (!record.ok()) return absl::StrCat("its holder cannot be read: ", record.status().message());
  std::string pid = "?", host = "?", address = "?";
  for (absl::string_view line : absl::StrSplit(*record, '\n', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&line, "pid ")) pid = std::string(line);
    if (absl::ConsumePrefix(&line, "host ")) host = std::string(line);
    if (absl::ConsumePrefix(&line, "address ")) address = std::string(line);
  }
  if (pid == "?" && host == "?") return "its holder has not recorded itself yet";
  return absl::StrCat("pid ", pid, " on host ", host, ", serving on ", address);
}

}  // namespace

absl::StatusOr<std::unique_ptr<StateDirLock>> StateDirLock::Acquire(const std::string& state_dir,
                                                                    const std::string& address) {
  if (state_dir.empty()) return absl::InvalidArgumentError("state directory: empty path");
  PT_RETURN_IF_ERROR(io::CheckNoNulByte(state_dir));
  PT_RETURN_IF_ERROR(io::EnsureDirectory(state_dir));
  std::string path = io::JoinPath(state_dir, kFileName);
  io::ScopedFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (fd.get() < 0) return io::ErrnoError(errno, "cannot open the lock file", path);
  int locked = -1;
  do {
    locked = ::flock(fd.get(), LOCK_EX | LOCK_NB);
  } while (locked != 0 && errno == EINTR);
  if (locked != 0) {
    if (errno != EWOULDBLOCK) return io::ErrnoError(errno, "cannot lock", path);
    return absl::FailedPreconditionError(absl::StrCat(
        "state directory ", state_dir, " is in use by another coordinator (", DescribeHolder(path),
        "; lock file ", path,
        "): one coordinator per state directory; stop that one first, or give this one its "
        "own state directory"));
  }
  PT_RETURN_IF_ERROR(WriteRecord(fd.get(), path, HolderRecord(address)));
  return std::unique_ptr<StateDirLock>(new StateDirLock(std::move(path), fd.Release()));
}

StateDirLock::~StateDirLock() { ::close(fd_); }

absl::Status StateDirLock::SetAddress(const std::string& address) {
  absl::MutexLock lock(&mu_);
  return WriteRecord(fd_, path_, HolderRecord(address));
}

}  // namespace pipetrain::coordinator
