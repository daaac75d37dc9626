// Instruction-set levels of the math kernels: which ones this binary was built with, which ones
// this CPU runs, and the one a group of processes must agree on.
//
// The math (layers and losses, with Eigen's kernels) is compiled once per level (kernels.h). The
// level decides the rounding of Eigen's products and reductions (their summation order follows
// the vector width), so every process of one training job, and the reference that checks it, must
// run the same level to produce the same bits. docs/performance.md, "Instruction sets".
#ifndef PIPETRAIN_COMMON_MATH_ISA_H_
#define PIPETRAIN_COMMON_MATH_ISA_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain::math {

// A level, ordered from least to most capable. The names are the psABI's x86-64 levels (what
// -march takes); kGeneric is the compiler's default target, the only level on other machines.
enum class Isa : int {
  kGeneric = 0,
  kX86_64_V3 = 3,  // AVX2 + FMA (Haswell, Zen 1 and later).
  kX86_64_V4 = 4,  // AVX-512 F/BW/CD/DQ/VL (Skylake-SP, Ice Lake, Zen 4 and later).
};

// "generic", "x86-64-v3", "x86-64-v4".
absl::string_view IsaName(Isa isa);

// The level named `name` (IsaName's spelling), built into this binary or not; none for a name no
// level has.
std::optional<Isa> IsaFromName(absl::string_view name);

// The level named `name` (IsaName's spelling). INVALID_ARGUMENT naming `name` and the levels this
// binary has otherwise, including for a known level this binary was not built with.
absl::StatusOr<Isa> ParseIsa(absl::string_view name);

// ParseIsa for an optional setting such as a --max-isa flag: none for "".
absl::StatusOr<std::optional<Isa>> ParseOptionalIsa(absl::string_view name);

// The levels this binary has kernels for, in increasing order (never empty). Thread-safe.
const std::vector<Isa>& BuiltIsas();

// True iff this CPU (and the OS, for the AVX-512 register state) can run code built for `isa`.
// Thread-safe.
bool CpuSupportsIsa(Isa isa);

// The built levels this CPU runs, at most `max` when given, in increasing order. Empty only when
// `max` is below every built level or the CPU runs none of them. Thread-safe.
std::vector<Isa> SupportedIsas(std::optional<Isa> max = std::nullopt);

// The highest of SupportedIsas(max). FAILED_PRECONDITION naming the CPU's shortfall when there is
// none (e.g. a CPU without AVX2 running a binary built for x86-64-v3 and up). Thread-safe.
absl::StatusOr<Isa> HighestSupportedIsa(std::optional<Isa> max = std::nullopt);

// The highest built level this process runs (HighestSupportedIsa()), or the lowest built level
// when the CPU runs none (whose kernels will then fault: callers that can report an error check
// HighestSupportedIsa first). What a Model uses unless told otherwise. Thread-safe.
Isa DefaultIsa();

// The highest level that appears in every one of `supported` (one list per process, e.g. the
// levels each worker of a job registered), at most `max` when given. FAILED_PRECONDITION naming
// the lists when no level is common to all, INVALID_ARGUMENT when `supported` is empty.
absl::StatusOr<Isa> PickCommonIsa(const std::vector<std::vector<Isa>>& supported,
                                  std::optional<Isa> max = std::nullopt);

// Names of `isas`, joined by ", " (for messages and logs).
std::string IsaListName(const std::vector<Isa>& isas);

}  // namespace pipetrain::math

#endif  // PIPETRAIN_COMMON_MATH_ISA_H_
