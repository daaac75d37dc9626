// Faults that cascade: k workers of a running 2-stage job SIGKILLed at random moments — the
// first after a random step, each next one at once, within 50 ms or within 1.5 s of the one
// before, so that it lands before, during or after the recovery the one before started — with k
// idle spares. The job
// recovers from all of them and `pipetrain train` ends with every loss and the final checkpoint's
// files bit for bit those of `pipetrain reference` (docs/recovery.md, "Faults during a recovery").
#include <sys/wait.h>
#include <unistd.h>

#include <iostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/sdk/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemons.h"
#include "tests/integration/daemons_fixture.h"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using testing::Example;
using testing::ReadFile;
using testing::StepLines;

constexpr int kStages = 2;
constexpr int kMaxFaults = 3;  // and as many spares.
constexpr int kSteps = 400;

class CascadingRecoveryTest : public testing::DaemonsTest {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("pipetrain_cascade_");
    ASSERT_FALSE(dir_.empty());
    ASSERT_EQ(daemons_.Start(dir_, kStages + kMaxFaults,
                             {"--client-lease", "10m", "--checkpoint-root", dir_}),
              "");
  }

  // The workers of job `id`'s current layout not yet in `killed`.
  std::vector<std::string> Alive(const std::string& id, const std::set<std::string>& killed) {
    std::vector<std::string> names;
    absl::StatusOr<v1::JobStatus> job = daemons_.client().GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return names;
    for (const v1::StageStatus& s : job->stages()) {
      if (!s.worker().empty() && killed.count(s.worker()) == 0) names.push_back(s.worker());
    }
    return names;
  }
};

TEST_F(CascadingRecoveryTest, KWorkersKilledAtRandomMomentsWithKSparesRecoverBitwise) {
  const unsigned seed = std::random_device()();
  std::mt19937 rng(seed);
  const int faults = 1 + static_cast<int>(rng() % kMaxFaults);
  const int first = 21 + static_cast<int>(rng() % 100);
  SCOPED_TRACE(absl::StrCat("seed ", seed, ": ", faults, " faults, the first after step ", first));
  const std::string flags = absl::StrCat(
      " --model ", Example("mlp_digits.textproto"),
      " --data digits --batch 16 --microbatches 4 --seed 11 --optimizer adamw:lr=1e-2 --json "
      "--steps ",
      kSteps);
  const testing::CommandRun ref = testing::RunReference(flags, dir_ + "/ref");
  ASSERT_EQ(ref.exit_code, 0) << ref.out;

  const std::string err = dir_ + "/train.err";
  testing::PipedChild train = testing::SpawnThrottledTrain(
      daemons_.address(),
      {"--stages", "2", "--schedule", "1f1b", "--checkpoint-every", "20", "--save", dir_ + "/pipe"},
      flags, err);
  ASSERT_GT(train.pid, 0);
  std::string out;
  ASSERT_TRUE(testing::ReadUntil(train, "{\"step\": 1,", &out)) << out << ReadFile(err);
  absl::StatusOr<std::vector<v1::JobStatus>> jobs = daemons_.client().ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  const std::string id = (*jobs)[0].job();
  ASSERT_TRUE(testing::ReadUntil(train, absl::StrCat("{\"step\": ", first, ","), &out))
      << out << ReadFile(err);

  std::set<std::string> killed;
  for (int f = 0; f < faults; ++f) {
    // Every worker of the layout already killed (two at once): the next fault waits until the
    // recovery has put replacements in (at most 30 s).
    std::vector<std::string> alive = Alive(id, killed);
    for (int poll = 0; poll < 3000 && alive.empty(); ++poll) {
      absl::SleepFor(absl::Milliseconds(10));
      alive = Alive(id, killed);
    }
    ASSERT_FALSE(alive.empty()) << "no replacement in the layout after 30 s";
    const std::string victim = alive[rng() % alive.size()];
    ASSERT_EQ(daemons_.KillWorker(victim), "");
    killed.insert(victim);
    // When the next fault lands (not a synchronisation): at once (two workers killed together),
    // within 50 ms (while the recovery assigns its replacements) or within 1.5 s.
    const int window[] = {0, 50, 1500};
    const int ms = window[rng() % 3];
    if (ms > 0) absl::SleepFor(absl::Milliseconds(rng() % ms));
  }
  const int status = testing::DrainAndWait(train, &out, 300000);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  ASSERT_EQ(WEXITSTATUS(status), 0) << out << ReadFile(err) << ReadFile(dir_ + "/coordinator.log");

  // The recoveries as `pipetrain train --json` reported them (their seconds, for docs/recovery.md).
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (absl::StartsWith(line, "{\"recovery\"")) std::cout << line << "\n";
  }
  // Every loss and the final weights are the reference's.
  const std::vector<std::string> want = StepLines(ref.out, /*pipeline=*/false);
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(StepLines(out, /*pipeline=*/true), want);
  const testing::LayerFiles layers = testing::CompareLayerFiles(dir_ + "/ref", dir_ + "/pipe");
  EXPECT_EQ(layers.compared, 3);  // the model's layers with weights.
  EXPECT_THAT(layers.differ, ::testing::IsEmpty());
  // Each killed worker is named once, as a recovery's lost worker or one lost during it.
  absl::StatusOr<v1::JobStatus> job = daemons_.client().GetJob(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_DONE);
  std::multiset<std::string> recorded;
  for (const v1::RecoveryEvent& r : job->recoveries()) {
    recorded.insert(r.lost_worker());
    recorded.insert(r.also_lost().begin(), r.also_lost().end());
  }
  EXPECT_EQ(recorded, std::multiset<std::string>(killed.begin(), killed.end()))
      << job->DebugString();
}

}  // namespace
}  // namespace pipetrain
