#include "common/io/input_file.h"

#include <sys/stat.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/io/file_util.h"
#include "common/io/scoped_fd.h"

namespace pipetrain::io {
namespace {

// What a file that is not a regular file is, for messages.
const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes,
                                            InputCompression compression) {
  if (absl::Status s = CheckNoNulByte(path); !s.ok()) return s;
  // stat, not open: opening a FIFO would block until a writer appears.
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoError(errno, "cannot read", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is ", FileKind(st.st_mode), ", not a regular file"));
  }
  if (st.st_size > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "'", path, "' has ", st.st_size, " bytes, more than the limit of ", max_bytes, " bytes"));
  }
  // ReadFile checks the limit again while reading, in case the file grows meanwhile.
  return compression == InputCompression::kGzipDetected ? ReadFileMaybeGzipped(path, max_bytes)
                                                        : ReadFile(path, max_bytes);
}

}  // namespace

absl::StatusOr<std::string> ReadInputFile(absl::string_view what, const std::string& path,
                                          int64_t max_bytes, InputCompression compression) {
  absl::StatusOr<std::string> content = ReadRegularFile(path, max_bytes, compression);
  if (content.ok()) return content;
  return absl::Status(content.status().code(),
                      absl::StrCat(what, ": ", content.status().message()));
}

}  // namespace pipetrain::io
