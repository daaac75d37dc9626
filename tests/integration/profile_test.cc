// Layer profiles through the service (issue 30), against a real coordinator and stage workers on
// 127.0.0.1: ProfileWorkers has every idle worker time the model's layers itself (a worker in a
// job is not asked), and `pipetrain plan --coordinator` costs the workers by those figures.
#include <string>

#include "absl/strings/str_cat.h"
#include "client/sdk/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemons.h"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using testing::Example;
using ::testing::HasSubstr;
using testing::ReadFile;
using testing::TempDir;

class ProfileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir("pipetrain_profile_");
    ASSERT_FALSE(dir_.empty());
    ASSERT_EQ(daemons_.Start(dir_, 3), "");
  }
  void TearDown() override {
    EXPECT_EQ(daemons_.Stop(), "");
    if (!HasFailure()) testing::RunCommand(absl::StrCat("rm -rf ", dir_));
  }

  std::string dir_;
  testing::Daemons daemons_;
};

TEST_F(ProfileTest, IdleWorkersTimeTheLayersAndPlanCostsThemByTheirOwnFigures) {
  // A one-stage job takes one worker: it is not asked.
  absl::StatusOr<v1::JobSpec> job = testing::DigitsJobSpec(1);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::JobStatus> created = daemons_.client().CreateJob(*job);
  ASSERT_TRUE(created.ok()) << created.status();
  const std::string busy = created->stages(0).worker();

  v1::ProfileWorkersRequest request;
  *request.mutable_model() = job->model();
  request.add_samples(4);
  request.add_samples(16);
  request.set_threads(1);
  request.mutable_optimizer()->mutable_sgd()->set_lr(0.1f);
  request.set_deadline_ms(120'000);
  absl::StatusOr<v1::ProfileWorkersResponse> r = daemons_.client().ProfileWorkers(request);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->workers_size(), 2);
  EXPECT_FALSE(r->isa().empty());
  for (const v1::WorkerLayerProfile& w : r->workers()) {
    EXPECT_NE(w.name(), busy);
    ASSERT_EQ(w.code(), 0) << w.name() << ": " << w.message();
    EXPECT_GT(w.gflops(), 0);
    EXPECT_GT(w.cpu_seconds(), 0);
    ASSERT_EQ(w.costs_size(), 2);
    EXPECT_EQ(w.costs(0).samples(), 4);
    EXPECT_EQ(w.costs(1).samples(), 16);
    for (const v1::SampleLayerCosts& c : w.costs()) {
      ASSERT_EQ(c.layers_size(), job->model().layers_size());
      EXPECT_GT(c.layers(0).forward(), 0);
      EXPECT_GT(c.layers(0).backward_weight(), 0);
    }
  }
  // A model the workers refuse fails in each entry, as Assign would.
  v1::ProfileWorkersRequest bad = request;
  bad.mutable_model()->mutable_layers(0)->mutable_linear()->set_out_features(-3);
  absl::StatusOr<v1::ProfileWorkersResponse> refused = daemons_.client().ProfileWorkers(bad);
  ASSERT_TRUE(refused.ok()) << refused.status();
  for (const v1::WorkerLayerProfile& w : refused->workers()) {
    EXPECT_EQ(w.code(), static_cast<int>(absl::StatusCode::kInvalidArgument)) << w.message();
    EXPECT_THAT(w.message(), HasSubstr("model: "));
  }

  const testing::CommandRun plan = testing::RunCommand(absl::StrCat(
      PIPETRAIN_BINARY, " plan --coordinator ", daemons_.address(), " --model ",
      Example("mlp_digits.textproto"), " --data digits --batch 16 --top 3 2>", dir_, "/plan.err"));
  ASSERT_EQ(plan.exit_code, 0) << ReadFile(dir_ + "/plan.err");
  EXPECT_THAT(plan.out, HasSubstr("costed by their own layer profiles: "));
  EXPECT_THAT(plan.out, ::testing::Not(HasSubstr("not profiled"))) << plan.out;
}

}  // namespace
}  // namespace pipetrain
