// Runs the real `pipetrain` binary on big or strange input (issue 14): each case must exit with
// code 1 and a message naming what was refused and the numbers, never die of a signal
// (std::bad_alloc / std::length_error used to abort) or read until memory runs out.
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/util/heap_tuning.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using testing::Example;
using ::testing::HasSubstr;

// Runs `[prefix; ]pipetrain ARGS` and expects exit code 1 (not a signal, which RunCommand
// reports as -1) with every one of `messages` in its output.
void ExpectRefused(const std::string& args, std::initializer_list<std::string> messages,
                   const std::string& prefix = "") {
  const testing::CommandRun r = testing::RunCommand(
      absl::StrCat(prefix, prefix.empty() ? "" : "; ", PIPETRAIN_BINARY, " ", args, " 2>&1"));
  EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.out;
  for (const std::string& m : messages) EXPECT_THAT(r.out, HasSubstr(m)) << args;
}

// Writes `contents` to a new file in a fresh temporary directory and returns its path.
std::string WriteModel(const std::string& contents) {
  const std::string path = testing::TempDir("pipetrain_limits_") + "/model.textproto";
  FILE* f = std::fopen(path.c_str(), "w");
  EXPECT_NE(f, nullptr) << path;
  if (f == nullptr) return path;
  std::fputs(contents.c_str(), f);
  std::fclose(f);
  return path;
}

const std::string kDigitsMlp = " --model " + Example("mlp_digits.textproto");

TEST(InputLimitsTest, SyntheticRowCountBeyondTheCap) {
  ExpectRefused("reference --data synthetic:9223372036854775807 --steps 1" + kDigitsMlp,
                {"pipetrain reference: synthetic dataset: row count 9223372036854775807: more "
                 "than the limit of 67108864 samples",
                 "[RESOURCE_EXHAUSTED]"});
  ExpectRefused("reference --data synthetic:99999999999999999999 --steps 1" + kDigitsMlp,
                {"99999999999999999999 (beyond 64 bits)", "[RESOURCE_EXHAUSTED]"});
}

TEST(InputLimitsTest, ModelFileMustBeASmallRegularFile) {
  ExpectRefused("reference --data digits --model /dev/zero",
                {"model spec file: '/dev/zero' is a character device, not a regular file",
                 "[INVALID_ARGUMENT]"});
  const std::string dir = testing::TempDir("pipetrain_limits_");
  ExpectRefused("reference --data digits --model " + dir,
                {"model spec file: '" + dir + "' is a directory", "[INVALID_ARGUMENT]"});
  // A FIFO nobody writes to: refused at once instead of blocking in open().
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ExpectRefused("reference --data digits --model " + fifo,
                {"model spec file: '" + fifo + "' is a FIFO", "[INVALID_ARGUMENT]"});
  // 16 MiB + 1 (sparse): refused from its size, without reading it.
  const std::string big = WriteModel("");
  ASSERT_EQ(::truncate(big.c_str(), (16 << 20) + 1), 0);
  ExpectRefused("reference --data digits --model " + big,
                {"model spec file: '" + big +
                     "' has 16777217 bytes, more than the limit of "
                     "16777216 bytes",
                 "[RESOURCE_EXHAUSTED]"});
}

TEST(InputLimitsTest, DataFileMustBeARegularFile) {
  ExpectRefused(
      "reference --data csv:/dev/zero" + kDigitsMlp,
      {"data file: '/dev/zero' is a character device, not a regular file", "[INVALID_ARGUMENT]"});
  const std::string dir = testing::TempDir("pipetrain_limits_");
  ExpectRefused("reference --data csv:" + dir + kDigitsMlp,
                {"data file: '" + dir + "' is a directory", "[INVALID_ARGUMENT]"});
  ExpectRefused("reference --data text:/dev/zero --model " + Example("gpt_char.textproto"),
                {"data file: '/dev/zero' is a character device", "[INVALID_ARGUMENT]"});
}

// The fault campaign's model: layer 2 has 2^30 weights (and 2^20 biases).
constexpr char kGiantLayer[] = R"pb(input_features: 64
                                    layers { linear { out_features: 1024 } }
                                    layers { relu {} }
                                    layers { linear { out_features: 1048576 } }
                                    layers { relu {} }
                                    layers { linear { out_features: 10 } }
                                    loss { softmax_cross_entropy {} }
)pb";

TEST(InputLimitsTest, LayerOf2To30WeightsIsRefusedBeforeAllocating) {
  const std::string model = WriteModel(kGiantLayer);
  const std::string message =
      "layer 2 (linear): 1074790400 parameters (largest: weight [1048576, 1024]) need "
      "17196646400 bytes to train";
  ExpectRefused("reference --data digits --steps 1 --model " + model,
                {message, "ModelLimits::max_parameter_bytes", "[RESOURCE_EXHAUSTED]"});
  ExpectRefused("partition --stages 2 --model " + model, {message, "[RESOURCE_EXHAUSTED]"});
}

TEST(InputLimitsTest, TheBudgetFollowsTheProcessMemoryLimit) {
  if (util::kSanitizerAllocator) {
    GTEST_SKIP() << "a sanitized binary cannot start under `ulimit -v` (its shadow memory is a "
                    "reservation of terabytes)";
  }
  // 2^28 weights need 4 GiB to train: within the default budget of a big machine, but not under
  // `ulimit -v 4000000` (KiB), where the budget is half of that limit.
  const std::string model = WriteModel(R"pb(input_features: 64
                                            layers { linear { out_features: 4194304 } }
                                            layers { linear { out_features: 10 } }
                                            loss { softmax_cross_entropy {} }
  )pb");
  ExpectRefused("reference --data digits --steps 1 --model " + model,
                {"layer 0 (linear): 272629760 parameters",
                 "more than the limit of 2048000000 bytes", "[RESOURCE_EXHAUSTED]"},
                "ulimit -v 4000000");
}

TEST(InputLimitsTest, AttentionOfOneSampleBeyondTheBudget) {
  const std::string model =
      WriteModel(R"pb(input_features: 16
                      layers { transformer_block { heads: 16 context: 65536 } }
                      layers { linear { out_features: 2 } }
                      loss { softmax_cross_entropy {} }
      )pb");
  ExpectRefused("reference --data synthetic --steps 1 --model " + model,
                {"layer 0 (transformer_block): the attention scores of one sample (heads 16 x "
                 "context 65536^2 floats) take 274877906944 bytes",
                 "ModelLimits::max_activation_bytes", "[RESOURCE_EXHAUSTED]"});
}

}  // namespace
}  // namespace pipetrain
