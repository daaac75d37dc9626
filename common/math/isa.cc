#include "common/math/isa.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain::math {
namespace {

constexpr Isa kAllIsas[] = {Isa::kGeneric, Isa::kX86_64_V3, Isa::kX86_64_V4};

// The levels CMake built kernels for (PIPETRAIN_ISA_LEVELS, common/math/CMakeLists.txt).
std::vector<Isa> MakeBuiltIsas() {
  std::vector<Isa> built;
#ifdef PIPETRAIN_ISA_HAVE_GENERIC
  built.push_back(Isa::kGeneric);
#endif
#ifdef PIPETRAIN_ISA_HAVE_X86_64_V3
  built.push_back(Isa::kX86_64_V3);
#endif
#ifdef PIPETRAIN_ISA_HAVE_X86_64_V4
  built.push_back(Isa::kX86_64_V4);
#endif
  return built;
}

}  // namespace

absl::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kGeneric:
      return "generic";
    case Isa::kX86_64_V3:
      return "x86-64-v3";
    case Isa::kX86_64_V4:
      return "x86-64-v4";
  }
  return "unknown";
}

std::string IsaListName(const std::vector<Isa>& isas) {
  return absl::StrJoin(isas, ", ",
                       [](std::string* out, Isa isa) { absl::StrAppend(out, IsaName(isa)); });
}

std::optional<Isa> IsaFromName(absl::string_view name) {
  for (Isa isa : kAllIsas) {
    if (IsaName(isa) == name) return isa;
  }
  return std::nullopt;
}

absl::StatusOr<Isa> ParseIsa(absl::string_view name) {
  const std::vector<Isa>& built = BuiltIsas();
  if (std::optional<Isa> isa = IsaFromName(name); isa.has_value()) {
    if (std::find(built.begin(), built.end(), *isa) != built.end()) return *isa;
    return absl::InvalidArgumentError(absl::StrCat("instruction set '", name,
                                                   "' is not built into this binary (it has ",
                                                   IsaListName(built), ")"));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown instruction set '", name,
                                                 "' (this binary has ", IsaListName(built), ")"));
}

absl::StatusOr<std::optional<Isa>> ParseOptionalIsa(absl::string_view name) {
  if (name.empty()) return std::optional<Isa>();
  absl::StatusOr<Isa> isa = ParseIsa(name);
  if (!isa.ok()) return isa.status();
  return std::optional<Isa>(*isa);
}

const std::vector<Isa>& BuiltIsas() {
  static const std::vector<Isa>* const built = new std::vector<Isa>(MakeBuiltIsas());
  return *built;
}

bool CpuSupportsIsa(Isa isa) {
  switch (isa) {
    case Isa::kGeneric:
      return true;
#if defined(__x86_64__)
      // libgcc's checks include the OS's support for the AVX and AVX-512 register state (XCR0).
      // clang 14 lacks the level names, so it checks the features that make up each level.
#if defined(__clang__)
    case Isa::kX86_64_V3:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
    case Isa::kX86_64_V4:
      return CpuSupportsIsa(Isa::kX86_64_V3) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512cd") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
    case Isa::kX86_64_V3:
      return __builtin_cpu_supports("x86-64-v3");
    case Isa::kX86_64_V4:
      return __builtin_cpu_supports("x86-64-v4");
#endif
#else
    default:
      return false;
#endif
  }
  return false;
}

std::vector<Isa> SupportedIsas(std::optional<Isa> max) {
  std::vector<Isa> out;
  for (Isa isa : BuiltIsas()) {
    if (max.has_value() && static_cast<int>(isa) > static_cast<int>(*max)) continue;
    if (CpuSupportsIsa(isa)) out.push_back(isa);
  }
  return out;
}

absl::StatusOr<Isa> HighestSupportedIsa(std::optional<Isa> max) {
  const std::vector<Isa> supported = SupportedIsas(max);
  if (supported.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this CPU runs none of the instruction sets built into this binary (",
        IsaListName(BuiltIsas()), ")",
        max.has_value() ? absl::StrCat(" at or below ", IsaName(*max)) : std::string()));
  }
  return supported.back();
}

Isa DefaultIsa() {
  static const Isa isa = [] {
    absl::StatusOr<Isa> best = HighestSupportedIsa();
    return best.ok() ? *best : BuiltIsas().front();
  }();
  return isa;
}

absl::StatusOr<Isa> PickCommonIsa(const std::vector<std::vector<Isa>>& supported,
                                  std::optional<Isa> max) {
  if (supported.empty()) {
    return absl::InvalidArgumentError("choosing an instruction set: no process to choose for");
  }
  for (auto it = std::rbegin(kAllIsas); it != std::rend(kAllIsas); ++it) {
    const Isa isa = *it;
    if (max.has_value() && static_cast<int>(isa) > static_cast<int>(*max)) continue;
    const bool everywhere =
        std::all_of(supported.begin(), supported.end(), [isa](const std::vector<Isa>& levels) {
          return std::find(levels.begin(), levels.end(), isa) != levels.end();
        });
    if (everywhere) return isa;
  }
  std::vector<std::string> lists;
  for (const std::vector<Isa>& levels : supported) {
    lists.push_back(absl::StrCat("[", IsaListName(levels), "]"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("no instruction set is common to every process",
                   max.has_value() ? absl::StrCat(" at or below ", IsaName(*max)) : std::string(),
                   ": ", absl::StrJoin(lists, ", ")));
}

}  // namespace pipetrain::math
