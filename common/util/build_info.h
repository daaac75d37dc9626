// What a binary was built from: the project version (CMake's `project(VERSION)`) and the git
// commit of the source tree when it was built (common/util/build_commit.cmake). Both are fixed at
// build time: nothing is read at run time, and nothing ever comes from a network.
#ifndef PIPETRAIN_COMMON_UTIL_BUILD_INFO_H_
#define PIPETRAIN_COMMON_UTIL_BUILD_INFO_H_

#include <string>

#include "absl/strings/string_view.h"

namespace pipetrain::util {

// The project version, e.g. "0.1.0". Never empty. Thread-safe.
absl::string_view ProjectVersion();

// The first 12 hex digits of the commit the source tree had checked out when this binary was
// built, or "" when that is not known (not a git checkout, or no git). Local changes on top of
// the commit are not marked. Thread-safe.
absl::string_view GitCommit();

// The line `PROGRAM --version` prints, without a newline: "pipetrain 0.1.0 (commit
// 0123456789ab)", or "pipetrain 0.1.0" when the commit is not known. Thread-safe.
std::string VersionLine(absl::string_view program);

}  // namespace pipetrain::util

#endif  // PIPETRAIN_COMMON_UTIL_BUILD_INFO_H_
