#include "common/io/data_dir.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace pipetrain::io {

std::string ExecutableDirectory() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  const std::string path(buf, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

std::string ResolveDataDir(const char* env, const std::string& executable_dir) {
  if (env != nullptr && env[0] != '\0') return env;
  if (executable_dir.empty()) return kDataDirFromBinary;
  return absl::StrCat(executable_dir, "/", kDataDirFromBinary);
}

std::string DefaultDataDir() {
  return ResolveDataDir(std::getenv(kDataDirEnv), ExecutableDirectory());
}

}  // namespace pipetrain::io
