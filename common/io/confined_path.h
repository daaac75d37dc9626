// Paths that a remote party names must stay under a root the operator configured.
#ifndef PIPETRAIN_COMMON_IO_CONFINED_PATH_H_
#define PIPETRAIN_COMMON_IO_CONFINED_PATH_H_

#include <string>

#include "absl/status/statusor.h"

namespace pipetrain::io {

// `path` if it lies under the directory `root` (or is `root` itself), normalised (".", ".." and
// repeated "/" removed). A relative `path` is taken relative to `root`. The longest existing
// prefix of the result is resolved with realpath, so a symbolic link cannot lead outside
// either. Errors: PERMISSION_DENIED naming the path and the root when it lies outside;
// INVALID_ARGUMENT for an empty path or root, or a root that is not an existing directory.
// Thread-safe.
absl::StatusOr<std::string> ConfinePath(const std::string& root, const std::string& path);

}  // namespace pipetrain::io

#endif  // PIPETRAIN_COMMON_IO_CONFINED_PATH_H_
