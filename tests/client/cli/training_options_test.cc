#include "client/cli/training_options.h"

#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pipetrain::cli {
namespace {

TrainingOptions Valid() {
  TrainingOptions o;
  o.model_path = "model.textproto";
  return o;
}

// Step counts are bounded by 2^53 like every counter of a checkpoint (they become doubles), so
// nothing computed from them (a resumed run's last step, the schedule's progress) can overflow.
// Before, --steps 2^63-1 was accepted and a resumed run's last step wrapped negative.
TEST(TrainingOptionsTest, StepsAreBoundedBy2To53) {
  TrainingOptions o = Valid();
  EXPECT_TRUE(CheckTrainingOptions(o).ok());
  o.steps = (int64_t{1} << 53) - 1;
  EXPECT_TRUE(CheckTrainingOptions(o).ok());
  for (int64_t steps : {int64_t{1} << 53, std::numeric_limits<int64_t>::max()}) {
    o.steps = steps;
    absl::Status s = CheckTrainingOptions(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), absl::StrCat("--steps must be in [1, 2^53), got ", steps));
  }
  o.steps = 0;
  EXPECT_EQ(CheckTrainingOptions(o).message(), "--steps must be in [1, 2^53), got 0");
}

}  // namespace
}  // namespace pipetrain::cli
