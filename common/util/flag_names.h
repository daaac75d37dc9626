// Flag spelling shared by every binary: names are written with dashes on the command line
// (--data-dir) and with underscores in code (Abseil flag names are identifiers).
#ifndef PIPETRAIN_COMMON_UTIL_FLAG_NAMES_H_
#define PIPETRAIN_COMMON_UTIL_FLAG_NAMES_H_

#include <algorithm>
#include <string>
#include <vector>

namespace pipetrain {

// argv with the name part of every -flag / --flag[=value] argument up to a lone "--" rewritten
// with underscores for dashes (values are left alone). Thread-safe.
inline std::vector<std::string> NormaliseFlagNames(int argc, char** argv) {
  std::vector<std::string> out(argv, argv + argc);
  for (size_t i = 1; i < out.size(); ++i) {
    std::string& a = out[i];
    if (a == "--") break;
    if (a.size() < 3 || a[0] != '-') continue;
    const size_t name_begin = a[1] == '-' ? 2 : 1;
    const size_t name_end = std::min(a.find('='), a.size());
    std::replace(a.begin() + name_begin, a.begin() + name_end, '-', '_');
  }
  return out;
}

// Pointers into `args` (valid while `args` lives unchanged), for absl::ParseCommandLine.
inline std::vector<char*> ArgvOf(std::vector<std::string>& args) {
  std::vector<char*> out;
  out.reserve(args.size());
  for (std::string& a : args) out.push_back(a.data());
  return out;
}

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_UTIL_FLAG_NAMES_H_
