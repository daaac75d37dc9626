// Directory utilities: listing, fsync, recursive removal, and publishing a directory as a unit.
//
// Publishing: a writer fills a fresh staging directory beside the destination
// (CreateStagingDirectory), fsyncs what it wrote, then PublishDirectory makes the staging
// directory appear under the destination's name in one rename -- or, if the destination exists,
// in one renameat2(RENAME_EXCHANGE) -- so that after a crash at any point the destination holds
// either its complete old or its complete new contents. What a crash can leave behind is a
// staging directory ("NAME.tmp-PID-RANDOM", see StagingTarget), never a partly replaced NAME.
//
// All functions are thread-safe (they share no state). Paths are not normalised beyond stripping
// trailing slashes; errors carry the errno text and the path.
#ifndef PIPETRAIN_COMMON_IO_DIR_UTIL_H_
#define PIPETRAIN_COMMON_IO_DIR_UTIL_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain::io {

// fsyncs the directory `path` itself (not its entries), so that creations, renames and removals
// of its entries survive a crash. NOT_FOUND if it does not exist.
absl::Status SyncDirectory(const std::string& path);

// Returns the names of the entries of directory `path` (without "." and ".."), sorted bytewise.
// NOT_FOUND if it does not exist; FAILED_PRECONDITION if it is not a directory.
absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& path);

// Removes `path` and, if it is a directory, everything below it, without following symbolic
// links. OK if `path` does not exist. Not atomic: see RemoveDirectoryAtomically.
absl::Status RemoveTree(const std::string& path);

// Creates a new, empty directory beside `dir` named "<dir>.tmp-<pid>-<16 hex digits>" (mode 0777
// minus the umask) and returns its path. The parent of `dir` must exist (NOT_FOUND otherwise).
// INVALID_ARGUMENT if `dir` is empty or ends in "." or ".." (or is "/"); trailing slashes are
// ignored.
absl::StatusOr<std::string> CreateStagingDirectory(const std::string& dir);

// If `name` (a single path component) has the form CreateStagingDirectory gives, returns the
// name of the directory it stages ("step-1.tmp-42-00ff00ff00ff00ff" -> "step-1"); otherwise "".
std::string StagingTarget(absl::string_view name);

// Makes the staging directory `staging` (filled, its files fsynced by the writer) appear as
// `dir`, which must be on the same file system (normally `staging` comes from
// CreateStagingDirectory(dir)):
//   - `dir` missing: renames `staging` to `dir`;
//   - `dir` an existing directory: exchanges the two atomically with renameat2(RENAME_EXCHANGE),
//     then removes the old contents, which are now at `staging`.
// fsyncs `staging` before and the parent directory after the rename, so the result is durable
// when this returns OK. The caller decides whether an existing `dir` may be replaced; this
// function replaces any directory.
// Errors, with `dir` unchanged: FAILED_PRECONDITION if `dir` exists and is not a directory, or if
// its file system cannot exchange directories atomically (renameat2 fails with EINVAL, ENOSYS or
// EOPNOTSUPP: e.g. some network file systems) -- there is no non-atomic fallback; other rename
// errors by errno. After the rename only the parent's fsync can fail (an I/O error: `dir` then
// holds the new contents, not yet durable). Once the rename succeeded the result is OK even if
// removing the old contents fails: they then stay in `staging`, which callers treat like any
// stale staging directory. With `keep_old_as` (a path beside `dir`, not existing or a directory
// it may replace), the old contents are moved there instead of removed (best effort: if that
// fails they are removed, and the publish is still OK).
absl::Status PublishDirectory(const std::string& staging, const std::string& dir,
                              const std::string& keep_old_as = "");

// Removes directory `path` so that a crash never leaves it half removed: renames it to a fresh
// staging name beside it (StagingTarget gives back its name), fsyncs the parent, then removes
// the renamed tree. OK if `path` does not exist.
absl::Status RemoveDirectoryAtomically(const std::string& path);

// Creates directory `path` (and missing parents) if needed, then proves it is writable by
// creating and removing a probe file in it. Errors name `path`: FAILED_PRECONDITION if it or a
// parent exists and is not a directory or the file system is read-only, PERMISSION_DENIED when
// the process may not create the directory or a file in it, others by errno.
absl::Status CheckWritableDirectory(const std::string& path);

}  // namespace pipetrain::io

#endif  // PIPETRAIN_COMMON_IO_DIR_UTIL_H_
