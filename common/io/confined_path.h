// Paths that a remote party names must stay under a root the operator configured.
#ifndef PIPETRAIN_COMMON_IO_CONFINED_PATH_H_
#define PIPETRAIN_COMMON_IO_CONFINED_PATH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace pipetrain::io {

// `path` if it lies under the directory `root` (or is `root` itself), normalised (".", ".." and
// repeated "/" removed). A relative `path` is taken relative to `root`. The longest existing
// prefix of the result is resolved with realpath, so a symbolic link cannot lead outside
// either. Errors: PERMISSION_DENIED naming the path and the root when it lies outside;
// INVALID_ARGUMENT for an empty path or root, a path or root with a NUL byte ("path contains a
// NUL byte"), or a root that is not an existing directory.
// Thread-safe.
absl::StatusOr<std::string> ConfinePath(const std::string& root, const std::string& path);

// Opens the file `name` inside the directory `dir` for reading, confined to `dir`: `name` must be
// a plain file name (no '/', not "." or ".."), and if `dir/name` is a symbolic link it is followed
// only when its target (all links resolved) lies under the real path of `dir`; the file actually
// opened is checked to lie there too (/proc/self/fd), so a link swapped in between cannot lead
// out either. The open never blocks (O_NONBLOCK: a FIFO is refused, not waited on). Returns the
// file descriptor, which the caller owns and must close. Errors: PERMISSION_DENIED naming the
// path and where it leads when it leads outside `dir`; INVALID_ARGUMENT for a name that is not
// plain, a NUL byte in `dir` or `name`, or a file that is neither regular nor a directory;
// FAILED_PRECONDITION for a directory; NOT_FOUND and other errno errors naming the path.
// Thread-safe.
absl::StatusOr<int> OpenConfinedFile(const std::string& dir, const std::string& name);

// The whole contents of OpenConfinedFile(dir, name), with ReadFile's limit `max_bytes`
// (RESOURCE_EXHAUSTED beyond it). Thread-safe.
absl::StatusOr<std::string> ReadConfinedFile(const std::string& dir, const std::string& name,
                                             int64_t max_bytes = int64_t{1} << 40);

}  // namespace pipetrain::io

#endif  // PIPETRAIN_COMMON_IO_CONFINED_PATH_H_
