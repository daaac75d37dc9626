// Proves that each instruction-set level's math object is sealed (docs/performance.md,
// "Instruction sets"): it defines exactly one global symbol, its entry, so the linker cannot merge
// any of its functions (Eigen's templates included) with another level's; and the x86-64-v3
// object contains no AVX-512 instruction, so its code runs on a CPU without AVX-512.
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using testing::RunCommand;

// level name -> path of its object, from PIPETRAIN_ISA_OBJECTS ("level=path,level=path").
std::map<std::string, std::string> LevelObjects() {
  std::map<std::string, std::string> out;
  for (absl::string_view item : absl::StrSplit(PIPETRAIN_ISA_OBJECTS, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    out[kv.first] = kv.second;
  }
  return out;
}

std::string EntryOf(const std::string& level) {
  std::string id = level;
  for (char& c : id) c = c == '-' ? '_' : c;
  return "pipetrain_math_kernels_" + id;
}

TEST(IsaObjectsTest, EachLevelObjectDefinesOnlyItsEntryGlobally) {
  const std::map<std::string, std::string> objects = LevelObjects();
  ASSERT_FALSE(objects.empty());
  for (const auto& [level, path] : objects) {
    SCOPED_TRACE(level + " " + path);
    // --defined-only -g: the defined global and weak symbols, one per line "addr type name".
    const testing::CommandRun run =
        RunCommand(std::string(PIPETRAIN_NM) + " --defined-only -g '" + path + "'");
    ASSERT_EQ(run.exit_code, 0) << run.out;
    std::set<std::string> globals;
    std::istringstream lines(run.out);
    for (std::string line; std::getline(lines, line);) {
      std::vector<std::string> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (fields.size() >= 3) globals.insert(fields[2]);
    }
    EXPECT_EQ(globals, std::set<std::string>{EntryOf(level)}) << run.out.substr(0, 2000);
    // ... while it does hold the level's own copy of Eigen's product kernel, now local.
    const testing::CommandRun all =
        RunCommand(std::string(PIPETRAIN_NM) + " --defined-only -C '" + path + "'");
    ASSERT_EQ(all.exit_code, 0);
    EXPECT_NE(all.out.find("Eigen::internal::gebp_kernel"), std::string::npos);
  }
}

// Counts the lines of `objdump -d` of `path` that use a zmm register or an opmask (k0-k7).
int CountAvx512Lines(const std::string& path) {
  const testing::CommandRun run =
      RunCommand(std::string(PIPETRAIN_OBJDUMP) + " -d --no-show-raw-insn '" + path +
                 "' | grep -c -E '%zmm|%k[0-7]'");
  // grep -c prints 0 (and exits 1) when nothing matches.
  return run.out.empty() ? -1 : std::stoi(run.out);
}

TEST(IsaObjectsTest, TheAvx2ObjectHasNoAvx512InstructionAndTheAvx512OneHas) {
  const std::map<std::string, std::string> objects = LevelObjects();
  if (objects.count("x86-64-v3") == 0) GTEST_SKIP() << "x86-64-v3 is not built";
  EXPECT_EQ(CountAvx512Lines(objects.at("x86-64-v3")), 0);
  // The check can fail: the AVX-512 level's object is full of such instructions.
  if (objects.count("x86-64-v4") != 0) {
    EXPECT_GT(CountAvx512Lines(objects.at("x86-64-v4")), 100);
  }
}

}  // namespace
}  // namespace pipetrain
