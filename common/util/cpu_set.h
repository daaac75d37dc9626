// The CPUs a process runs on: Linux CPU lists ("0-3,8,10-11", the syntax of taskset -c, cpusets
// and /sys/devices/system/cpu/online), the CPUs this process may use (its affinity mask, which a
// container's cpuset or taskset narrows), and confining a daemon to some of them.
//
// Why a daemon is confined (stage_worker --cpus, set by `pipetrain local`): two workers sharing
// the machine's cores each keep one core busy with their math, and the gRPC thread that must read
// a neighbour's tensor is sometimes queued behind the *other* worker's compute thread while the
// core of the worker waiting for that tensor idles — until the scheduler's next balancing tick
// (4 ms at 250 Hz). A worker confined to its own cores runs its network threads where its compute
// thread waits (docs/performance.md, "One core per worker").
#ifndef PIPETRAIN_COMMON_UTIL_CPU_SET_H_
#define PIPETRAIN_COMMON_UTIL_CPU_SET_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain::util {

// Highest CPU number a list may name, plus one (glibc's cpu_set_t).
inline constexpr int kMaxCpus = 1024;

// The CPUs of a list such as "0-3,8,10-11" (comma-separated numbers and ascending inclusive
// ranges; whitespace around items allowed), sorted, each once (overlapping items are merged).
// INVALID_ARGUMENT naming the bad item for an empty list or item, a non-number, a descending
// range, or a CPU >= kMaxCpus.
absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view text);

// The shortest list for `cpus` (any order, repeats allowed): "0-3,8". "" for none.
std::string FormatCpuList(std::vector<int> cpus);

// The CPUs the calling thread may run on (its affinity mask), sorted; empty if the kernel does
// not say.
std::vector<int> AllowedCpus();

// How many CPUs the calling thread may run on: the size of AllowedCpus(), or
// std::thread::hardware_concurrency() if that is empty; at least 1.
int UsableCpuCount();

// `groups` disjoint groups of `per_group` CPUs each, taken in order from `cpus` (sorted): group g
// is cpus[g * per_group, (g + 1) * per_group). Empty if they do not fit (groups * per_group >
// cpus.size()) or groups or per_group < 1. The CPUs of each worker of `pipetrain local`.
std::vector<std::vector<int>> CpuGroups(const std::vector<int>& cpus, int groups, int per_group);

// Confines the calling thread — and every thread it starts afterwards — to `cpus`. Call it at the
// start of main(), before other threads run, to confine the whole process. INVALID_ARGUMENT if
// `cpus` is empty or names a CPU this thread may not use (the message lists the allowed ones);
// INTERNAL if the kernel refuses.
absl::Status ConfineToCpus(const std::vector<int>& cpus);

// ConfineToCpus(ParseCpuList(list)): the errors of either (`stage_worker --cpus LIST`).
absl::Status ConfineToCpuList(absl::string_view list);

}  // namespace pipetrain::util

#endif  // PIPETRAIN_COMMON_UTIL_CPU_SET_H_
