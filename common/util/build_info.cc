#include "common/util/build_info.h"

#include "absl/strings/str_cat.h"
// Generated into the build directory by common/util/build_commit.cmake: PIPETRAIN_GIT_COMMIT.
#include "build_commit.h"

#ifndef PIPETRAIN_VERSION
#error "PIPETRAIN_VERSION (the CMake project version) must be defined"
#endif

namespace pipetrain::util {

absl::string_view ProjectVersion() { return PIPETRAIN_VERSION; }

absl::string_view GitCommit() { return PIPETRAIN_GIT_COMMIT; }

std::string VersionLine(absl::string_view program) {
  const absl::string_view commit = GitCommit();
  return commit.empty() ? absl::StrCat(program, " ", ProjectVersion())
                        : absl::StrCat(program, " ", ProjectVersion(), " (commit ", commit, ")");
}

}  // namespace pipetrain::util
