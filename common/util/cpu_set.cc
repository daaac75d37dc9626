#include "common/util/cpu_set.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pipetrain::util {
namespace {

absl::StatusOr<int> ParseCpu(absl::string_view text, absl::string_view item) {
  int cpu = -1;
  if (!absl::SimpleAtoi(text, &cpu) || cpu < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CPU list item '", item, "': '", text, "' is not a CPU number"));
  }
  if (cpu >= kMaxCpus) {
    return absl::InvalidArgumentError(absl::StrCat("CPU list item '", item, "': CPU ", cpu,
                                                   " is beyond the highest, ", kMaxCpus - 1));
  }
  return cpu;
}

}  // namespace

absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view text) {
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError("empty CPU list (expected e.g. 0-3,8)");
  }
  std::vector<int> cpus;
  for (absl::string_view raw : absl::StrSplit(text, ',')) {
    const absl::string_view item = absl::StripAsciiWhitespace(raw);
    if (item.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("CPU list '", text, "' has an empty item (expected e.g. 0-3,8)"));
    }
    const size_t dash = item.find('-');
    if (dash == absl::string_view::npos) {
      absl::StatusOr<int> cpu = ParseCpu(item, item);
      if (!cpu.ok()) return cpu.status();
      cpus.push_back(*cpu);
      continue;
    }
    absl::StatusOr<int> first = ParseCpu(absl::StripAsciiWhitespace(item.substr(0, dash)), item);
    if (!first.ok()) return first.status();
    absl::StatusOr<int> last = ParseCpu(absl::StripAsciiWhitespace(item.substr(dash + 1)), item);
    if (!last.ok()) return last.status();
    if (*last < *first) {
      return absl::InvalidArgumentError(
          absl::StrCat("CPU list item '", item, "': the range runs backwards"));
    }
    for (int cpu = *first; cpu <= *last; ++cpu) cpus.push_back(cpu);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string FormatCpuList(std::vector<int> cpus) {
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    absl::StrAppend(&out, cpus[i]);
    if (j > i) absl::StrAppend(&out, "-", cpus[j]);
    i = j + 1;
  }
  return out;
}

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < kMaxCpus; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

int UsableCpuCount() {
  const size_t allowed = AllowedCpus().size();
  if (allowed > 0) return static_cast<int>(allowed);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::vector<std::vector<int>> CpuGroups(const std::vector<int>& cpus, int groups, int per_group) {
  std::vector<std::vector<int>> out;
  if (groups < 1 || per_group < 1 ||
      static_cast<int64_t>(groups) * per_group > static_cast<int64_t>(cpus.size())) {
    return out;
  }
  for (int g = 0; g < groups; ++g) {
    out.emplace_back(cpus.begin() + static_cast<ptrdiff_t>(g) * per_group,
                     cpus.begin() + static_cast<ptrdiff_t>(g + 1) * per_group);
  }
  return out;
}

absl::Status ConfineToCpus(const std::vector<int>& cpus) {
  if (cpus.empty()) return absl::InvalidArgumentError("no CPU to run on");
  const std::vector<int> allowed = AllowedCpus();
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) {
    if (cpu < 0 || cpu >= kMaxCpus ||
        (!allowed.empty() && !std::binary_search(allowed.begin(), allowed.end(), cpu))) {
      return absl::InvalidArgumentError(absl::StrCat("CPU ", cpu,
                                                     " is not available to this process (it may "
                                                     "use ",
                                                     FormatCpuList(allowed), ")"));
    }
    CPU_SET(cpu, &set);
  }
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return absl::InternalError(
        absl::StrCat("sched_setaffinity(", FormatCpuList(cpus), "): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status ConfineToCpuList(absl::string_view list) {
  absl::StatusOr<std::vector<int>> cpus = ParseCpuList(list);
  if (!cpus.ok()) return cpus.status();
  return ConfineToCpus(*cpus);
}

}  // namespace pipetrain::util
