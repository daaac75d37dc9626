// Faults during a recovery, against fake workers (no sockets): a replacement lost while it takes
// over, one that never answers its Assign, and k faults at random moments with k spares. Each
// time the recovery starts over with what is left (docs/recovery.md).
#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/coordinator/core_test_fixture.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::MakeBatch;
using testing::MakeSpec;

using JobRecoveryTest = testing::CoreTest;

bool ReadyAfter(const v1::JobStatus& s, int recoveries) {
  return s.state() == v1::JOB_STATE_READY && s.recoveries_size() == recoveries;
}

TEST_F(JobRecoveryTest, AReplacementLostWhileTakingOverIsReplacedByTheNextSpare) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2, /*recover=*/true));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Step(MakeBatch(job->job(), 4)).ok());
  AddWorkers(1);  // w2: it dies while it takes over rank 1.
  workers_[2]->HoldAssigns();
  workers_[1]->Gone();
  ASSERT_TRUE(workers_[2]->WaitFor("assign"));
  AddWorkers(1);  // w3: idle once w2 was chosen.
  workers_[2]->Gone();
  // The assignment does not wait for w2 (2 minutes by default): the recovery starts over.
  absl::StatusOr<v1::JobStatus> status =
      AwaitJob(job->job(), [](const v1::JobStatus& s) { return ReadyAfter(s, 1); });
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_TRUE(ReadyAfter(*status, 1)) << status->DebugString();
  const v1::RecoveryEvent& event = status->recoveries(0);
  EXPECT_EQ(event.lost_worker(), "w1");
  EXPECT_THAT(event.also_lost(), ElementsAre("w2"));
  EXPECT_THAT(event.workers(), ElementsAre("w0", "w3"));
  EXPECT_EQ(event.generation(), 3);  // 2 was w2's, abandoned.
  EXPECT_EQ(workers_[3]->assign().generation(), 3);
  EXPECT_EQ(workers_[3]->assign().rank(), 1);
  EXPECT_EQ(workers_[0]->assign().generation(), 3);
  absl::StatusOr<v1::StepResult> r = Step(MakeBatch(job->job(), 4, /*expected_steps_done=*/0));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step(), 1);
}

// A replacement that neither answers nor goes (hung with its connection up) is evicted after the
// Assign timeout, as a rank that misses a step's deadline is.
class ShortAssignTimeoutTest : public testing::CoreTest {
 protected:
  void Adjust(CoordinatorOptions& options) const override {
    options.assign_timeout = absl::Seconds(1);
  }
};

TEST_F(ShortAssignTimeoutTest, AReplacementThatNeverAnswersIsEvictedAndTheNextSpareTakesOver) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2, /*recover=*/true));
  ASSERT_TRUE(job.ok()) << job.status();
  AddWorkers(1);
  workers_[2]->HoldAssigns();
  workers_[1]->Gone();
  ASSERT_TRUE(workers_[2]->WaitFor("assign"));
  AddWorkers(1);
  absl::StatusOr<v1::JobStatus> status =
      AwaitJob(job->job(), [](const v1::JobStatus& s) { return ReadyAfter(s, 1); });
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_TRUE(ReadyAfter(*status, 1)) << status->DebugString();
  EXPECT_THAT(status->recoveries(0).also_lost(), ElementsAre("w2"));
  EXPECT_THAT(status->recoveries(0).workers(), ElementsAre("w0", "w3"));
  ASSERT_TRUE(workers_[2]->closed().has_value());
  EXPECT_THAT(workers_[2]->closed()->message(), HasSubstr("no Assigned for generation 2"));
  for (const v1::WorkerInfo& w : core_->ListWorkers()) EXPECT_NE(w.name(), "w2");
}

// The workers of the job's current layout that are still running.
std::vector<std::string> Layout(const v1::JobStatus& s, const std::set<std::string>& dead) {
  std::vector<std::string> names;
  for (const v1::StageStatus& stage : s.stages()) {
    if (dead.count(stage.worker()) == 0) names.push_back(stage.worker());
  }
  return names;
}

// k faults (1 to 3) at random moments — before, during and after the recovery each earlier one
// started — with k spares: the job ends READY on live workers, every lost worker recorded once.
TEST_F(JobRecoveryTest, KFaultsAtRandomMomentsWithKSparesRecover) {
  const unsigned seed = std::random_device()();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    if (trial > 0) {
      TearDown();
      SetUp();
    }
    const int stages = 2 + static_cast<int>(rng() % 2);
    const int k = 1 + static_cast<int>(rng() % 3);
    SCOPED_TRACE(absl::StrCat("trial ", trial, ": ", stages, " stages, ", k, " faults"));
    AddWorkers(stages);
    absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(stages, 2, /*recover=*/true));
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_TRUE(Step(MakeBatch(job->job(), 4)).ok());
    AddWorkers(k);
    // Every worker takes 0 to 2 ms to answer an Assign (building its stages): faults land while
    // a recovery waits for its Assigned as well as before and after.
    for (auto& w : workers_) w->DelayAssigns(absl::Microseconds(rng() % 2000));
    std::set<std::string> killed;
    for (int f = 0; f < k; ++f) {
      absl::StatusOr<v1::JobStatus> now = core_->GetJob(job->job());
      ASSERT_TRUE(now.ok());
      const std::vector<std::string> alive = Layout(*now, killed);
      ASSERT_FALSE(alive.empty());
      const std::string victim = alive[rng() % alive.size()];
      killed.insert(victim);
      workers_[std::stoi(victim.substr(1))]->Gone();
      // The moment of the next fault (0 to 2 ms later), not a synchronisation.
      absl::SleepFor(absl::Microseconds(rng() % 2000));
    }
    absl::StatusOr<v1::JobStatus> status = AwaitJob(job->job(), [&](const v1::JobStatus& s) {
      return s.state() == v1::JOB_STATE_READY &&
             static_cast<int>(Layout(s, killed).size()) == stages;
    });
    ASSERT_TRUE(status.ok()) << status.status();
    ASSERT_EQ(status->state(), v1::JOB_STATE_READY) << status->DebugString();
    ASSERT_EQ(static_cast<int>(Layout(*status, killed).size()), stages) << status->DebugString();
    std::multiset<std::string> recorded;
    for (const v1::RecoveryEvent& r : status->recoveries()) {
      recorded.insert(r.lost_worker());
      recorded.insert(r.also_lost().begin(), r.also_lost().end());
    }
    EXPECT_EQ(recorded, std::multiset<std::string>(killed.begin(), killed.end()))
        << status->DebugString();
    absl::StatusOr<v1::StepResult> r = Step(MakeBatch(job->job(), 4, status->steps_done()));
    ASSERT_TRUE(r.ok()) << r.status();
  }
}

}  // namespace
}  // namespace pipetrain::coordinator
