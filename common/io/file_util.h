// Whole-file reads and crash-safe whole-file writes.
//
// All functions are thread-safe (they share no state); concurrent writers of the same path each
// use their own temporary file, and the last rename wins.
#ifndef PIPETRAIN_COMMON_IO_FILE_UTIL_H_
#define PIPETRAIN_COMMON_IO_FILE_UTIL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain::io {

// INVALID_ARGUMENT "path contains a NUL byte: '<path, C-escaped (\000)>'" if `path` holds a NUL
// byte, else OK. The system calls see a path only up to its first NUL ("ckpt\0x" would silently
// mean "ckpt"), so every function of common/io that takes a path refuses one with a NUL byte first.
absl::Status CheckNoNulByte(absl::string_view path);

// Replaces the file at `path` with `contents` so that after a crash the path holds either the old
// or the new contents, never a mix: writes a temporary file in the same directory, fsyncs it,
// renames it over `path` and fsyncs the directory. The new file's mode is 0666 minus the umask.
// Errors: CheckNoNulByte's; errno errors carry the errno text and the path (e.g. NOT_FOUND when the
// directory does not exist, PERMISSION_DENIED); on error the temporary file is removed and `path`
// is left untouched.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// Returns the whole contents of the file at `path`. NOT_FOUND if it does not exist; other errors
// carry the errno text and the path. RESOURCE_EXHAUSTED if the file is larger than `max_bytes`.
absl::StatusOr<std::string> ReadFile(const std::string& path, int64_t max_bytes = int64_t{1} << 40);

// ReadFile on a file already open as `fd` (read from its current offset to the end; `fd` is
// neither closed nor owned). `path` names the file in messages.
absl::StatusOr<std::string> ReadOpenFile(int fd, const std::string& path,
                                         int64_t max_bytes = int64_t{1} << 40);

// Like ReadFile, but if the file starts with the gzip magic bytes it is decompressed (all
// concatenated gzip members). A corrupt or truncated gzip stream is DATA_LOSS naming the path;
// RESOURCE_EXHAUSTED if the decompressed size exceeds `max_bytes`.
absl::StatusOr<std::string> ReadFileMaybeGzipped(const std::string& path,
                                                 int64_t max_bytes = int64_t{4} << 30);

// Creates directory `path` and any missing parents (mode 0777 minus the umask). OK if it already
// exists as a directory; FAILED_PRECONDITION if it (or a parent) exists and is not a directory.
absl::Status EnsureDirectory(const std::string& path);

// True if `path` names a directory (after symlinks); false if it is anything else or missing.
bool IsDirectory(const std::string& path);

// Returns the directory part of `path` ("." if it has none, "/" for files in the root).
std::string DirName(const std::string& path);

// Returns `a` and `b` joined with exactly one '/' between them (`b` unchanged if `a` is empty).
std::string JoinPath(absl::string_view a, absl::string_view b);

}  // namespace pipetrain::io

#endif  // PIPETRAIN_COMMON_IO_FILE_UTIL_H_
