#include "common/io/confined_path.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

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

}  // namespace pipetrain::io
