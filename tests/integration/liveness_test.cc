// A coordinator that stops answering is noticed by its clients within seconds. The test freezes a
// real `coordinator` process with SIGSTOP (its sockets stay open and the kernel still accepts
// bytes, but nothing replies: a hung or swapped-out daemon, or a host that vanished without a
// reset, looks the same): `pipetrain train` says that the coordinator stopped answering, waits
// --reconnect-timeout for it and exits 1, and the coordinator, continued, ends the orphaned job by
// its client lease; a TrainSession::Step blocked on it ends UNAVAILABLE through the channel's
// keepalive, and a GetJob ends within its deadline. Every process is started by the test and
// signalled by its PID only; the frozen coordinator is killed (SIGKILL) in the tear-down.
#include <signal.h>
#include <sys/wait.h>

#include <iostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/sdk/client.h"
#include "common/math/tensor.h"
#include "common/model/model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemons.h"
#include "tests/integration/daemons_fixture.h"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using testing::Example;
using testing::ReadFile;
using testing::TempDir;

using ::testing::HasSubstr;

constexpr int kWorkers = 2;

class LivenessTest : public testing::DaemonsTest {
 protected:
  // Flags the coordinator and the workers get besides their addresses and names.
  virtual std::vector<std::string> CoordinatorFlags() const { return {}; }
  virtual std::vector<std::string> WorkerFlags() const { return {}; }

  void SetUp() override {
    dir_ = TempDir("pipetrain_live_");
    ASSERT_FALSE(dir_.empty());
    ASSERT_EQ(daemons_.Start(dir_, kWorkers, CoordinatorFlags(), WorkerFlags()), "");
  }

  void TearDown() override {
    if (daemons_.coordinator() > 0) kill(daemons_.coordinator(), SIGKILL);
    DaemonsTest::TearDown();
  }

  // Stops the coordinator (SIGSTOP) and waits until it has stopped (a signal is delivered
  // asynchronously: it may still answer a call just after kill returns); then runs `call` and
  // returns its result and how long after the freeze it returned, which it prints as `what`.
  template <typename Call>
  auto WhileFrozen(const std::string& what, Call call)
      -> std::pair<decltype(call()), absl::Duration> {
    const pid_t pid = daemons_.coordinator();
    EXPECT_EQ(kill(pid, SIGSTOP), 0);
    int status = 0;
    EXPECT_EQ(waitpid(pid, &status, WUNTRACED), pid);
    EXPECT_TRUE(WIFSTOPPED(status));
    const absl::Time frozen = absl::Now();
    auto result = call();
    const absl::Duration took = absl::Now() - frozen;
    std::cout << what << " ended " << absl::FormatDuration(took)
              << " after the coordinator froze\n";
    return {std::move(result), took};
  }

  // What the client says when the coordinator stops answering.
  std::string StoppedAnswering() const {
    return absl::StrCat("the coordinator at ", daemons_.address(), " stopped answering (");
  }

  // A ready 2-stage job of the digits MLP.
  absl::StatusOr<v1::JobStatus> CreateJob() {
    absl::StatusOr<v1::JobSpec> job = testing::DigitsJobSpec(kWorkers);
    if (!job.ok()) return job.status();
    return daemons_.client().CreateJob(*job);
  }
};

// A batch of `samples` digits-shaped samples (64 features, class 0).
struct Batch {
  explicit Batch(int64_t samples)
      : inputs(math::Matrix::Constant(samples, 64, 0.5f)),
        targets(math::Matrix::Zero(samples, 1)),
        samples(samples) {}
  client::BatchView view() const { return {&inputs, &targets, samples}; }

  math::Matrix inputs;
  math::Matrix targets;
  int64_t samples;
};

// A coordinator whose client lease is short, so that the test sees an orphaned job end.
class FrozenCoordinatorTest : public LivenessTest {
 protected:
  std::vector<std::string> CoordinatorFlags() const override { return {"--client-lease", "2s"}; }

  // Waits (at most 60 s) until job `id` is CANCELLED by the client lease and every worker is
  // idle. ListJobs and ListWorkers, unlike a call naming the job, do not renew its lease.
  bool AwaitLeaseEnded(const std::string& id) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      absl::StatusOr<std::vector<v1::JobStatus>> jobs = daemons_.client().ListJobs();
      absl::StatusOr<std::vector<v1::WorkerInfo>> workers = daemons_.client().ListWorkers();
      bool ended = false, idle = workers.ok() && workers->size() == static_cast<size_t>(kWorkers);
      for (const v1::JobStatus& j : jobs.ok() ? *jobs : std::vector<v1::JobStatus>()) {
        ended = ended || (j.job() == id && j.state() == v1::JOB_STATE_CANCELLED &&
                          absl::StrContains(j.reason(), "client gone"));
      }
      for (const v1::WorkerInfo& w : workers.ok() ? *workers : std::vector<v1::WorkerInfo>()) {
        idle = idle && w.job().empty();
      }
      if (ended && idle) return true;
      absl::SleepFor(absl::Milliseconds(50));  // polling a bounded wait.
    }
    return false;
  }
};

// The CLI against a coordinator that freezes (SIGSTOP) mid-run: it says within about 10 s that
// the coordinator stopped answering and that it waits up to --reconnect-timeout (a frozen or
// restarting coordinator that comes back continues the job), then exits 1 saying that it could
// not be reached again and that its job could not be cancelled — within 10 s + the reconnect
// timeout + one poll + the 5 s cancel (docs/architecture.md, "Client liveness"). Continued
// (SIGCONT), the coordinator ends the orphaned job by its client lease and both workers are idle.
TEST_F(FrozenCoordinatorTest, TrainWaitsItsReconnectTimeoutThenTheLeaseFreesTheWorkers) {
  const std::string err = dir_ + "/train.err";
  testing::PipedChild train =
      testing::SpawnEndlessTrain(daemons_.address(), err, {"--reconnect-timeout", "3s"});
  ASSERT_GT(train.pid, 0);
  std::string out;
  ASSERT_TRUE(testing::ReadUntil(train, "{\"step\"", &out, 60000)) << out << ReadFile(err);
  absl::StatusOr<std::vector<v1::JobStatus>> jobs = daemons_.client().ListJobs();
  ASSERT_TRUE(jobs.ok() && jobs->size() == 1) << jobs.status();
  const std::string job = (*jobs)[0].job();
  const std::string waiting =
      "\"code\": \"UNAVAILABLE\", \"for\": \"coordinator\", "
      "\"reconnect_timeout_s\": 3.000}}\n";
  absl::Duration noticed = absl::InfiniteDuration();
  const auto [status, took] = WhileFrozen("pipetrain train", [&] {
    const absl::Time frozen = absl::Now();
    if (testing::ReadUntil(train, waiting, &out, 30000)) noticed = absl::Now() - frozen;
    return testing::DrainAndWait(train, &out, 40000);
  });
  ASSERT_NE(status, -1) << "still running 70 s after the coordinator froze: " << ReadFile(err);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_THAT(out, HasSubstr(waiting));
  EXPECT_LT(noticed, absl::Seconds(15));
  const std::string error = ReadFile(err);
  EXPECT_THAT(error, HasSubstr(absl::StrCat(StoppedAnswering(), "no keepalive reply within 5s)")));
  EXPECT_THAT(error, HasSubstr("; the coordinator was not reachable again within 3s; job " + job +
                               " could not be cancelled ("));
  EXPECT_THAT(error, HasSubstr("its --client-lease, counted from when it runs again"));
  EXPECT_GE(took, noticed + absl::Seconds(3));
  EXPECT_LT(took, absl::Seconds(10 + 3 + 3 + 5 + 4));

  ASSERT_EQ(kill(daemons_.coordinator(), SIGCONT), 0);
  EXPECT_TRUE(AwaitLeaseEnded(job)) << ReadFile(dir_ + "/coordinator.log");
}

// The SDK: a Step blocked on a frozen coordinator ends UNAVAILABLE within keepalive interval +
// timeout (10 s with the defaults), and the session stays failed.
TEST_F(LivenessTest, StepOnAFrozenCoordinatorEndsUnavailable) {
  absl::StatusOr<v1::JobStatus> job = CreateJob();
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<std::unique_ptr<client::TrainSession>> session =
      daemons_.client().StartTraining(job->job());
  ASSERT_TRUE(session.ok()) << session.status();
  const Batch batch(4);
  absl::StatusOr<v1::StepResult> step = (*session)->Step(batch.view());
  ASSERT_TRUE(step.ok()) << step.status();

  absl::Duration took;
  std::tie(step, took) = WhileFrozen("Step", [&] { return (*session)->Step(batch.view()); });
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), absl::StatusCode::kUnavailable) << step.status();
  EXPECT_THAT(std::string(step.status().message()),
              HasSubstr(absl::StrCat(StoppedAnswering(), "no keepalive reply within 5s)")));
  EXPECT_LT(took, absl::Seconds(15));
  EXPECT_EQ((*session)->Finish(), step.status());
}

// The SDK: a Step still sending its batch (32 MiB, after 8 MiB ones opened the flow-control
// windows) when the coordinator freezes ends UNAVAILABLE as well: through the keepalive, or through
// the socket's unacknowledged-data timeout (gRPC sets it to the keepalive timeout) once the frozen
// side's buffers are full. A 2 s keepalive here: both are noticed within 2 + 2 s.
TEST_F(LivenessTest, StepSendingALargeBatchToAFrozenCoordinatorEndsUnavailable) {
  absl::StatusOr<v1::JobStatus> job = CreateJob();
  ASSERT_TRUE(job.ok()) << job.status();
  client::ClientOptions options;
  options.keepalive_interval = absl::Seconds(2);
  options.keepalive_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<client::Client>> c =
      client::Client::Connect(daemons_.address(), options);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<std::unique_ptr<client::TrainSession>> session = (*c)->StartTraining(job->job());
  ASSERT_TRUE(session.ok()) << session.status();
  const Batch warm(32768);
  for (int i = 0; i < 2; ++i) {
    const absl::StatusOr<v1::StepResult> step = (*session)->Step(warm.view());
    ASSERT_TRUE(step.ok()) << step.status();
  }
  const Batch large(131072);
  const auto [step, took] =
      WhileFrozen("Step of a 32 MiB batch", [&] { return (*session)->Step(large.view()); });
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), absl::StatusCode::kUnavailable) << step.status();
  EXPECT_THAT(std::string(step.status().message()), HasSubstr(StoppedAnswering()));
  EXPECT_THAT(std::string(step.status().message()), HasSubstr(" 2s)"));
  EXPECT_LT(took, absl::Seconds(8));
}

// The SDK: a unary call on a frozen coordinator ends at its deadline (here 2 s, sooner than the
// keepalive's 5-10 s), saying which coordinator did not answer.
TEST_F(LivenessTest, GetJobOnAFrozenCoordinatorEndsWithinItsDeadline) {
  client::ClientOptions options;
  options.call_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<client::Client>> c =
      client::Client::Connect(daemons_.address(), options);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->ListJobs().ok());

  const auto [job, took] = WhileFrozen("GetJob", [&] { return (*c)->GetJob("job-1"); });
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kDeadlineExceeded) << job.status();
  EXPECT_THAT(std::string(job.status().message()),
              HasSubstr(absl::StrCat("GetJob: the coordinator at ", daemons_.address(),
                                     " did not answer within 2s")));
  EXPECT_GE(took, absl::Seconds(2) - absl::Milliseconds(50));
  EXPECT_LT(took, absl::Seconds(4));
}

// Options that would make the coordinator refuse the pings, or end every call at once, are
// refused before anything is sent.
TEST(ClientOptionsTest, UnusableOptionsAreRefused) {
  client::ClientOptions options;
  options.keepalive_interval = absl::Milliseconds(500);
  absl::StatusOr<std::unique_ptr<client::Client>> c =
      client::Client::Connect("127.0.0.1:1", options);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("keepalive_interval"));
  options = client::ClientOptions();
  options.call_timeout = absl::ZeroDuration();
  c = client::Client::Connect("127.0.0.1:1", options);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("call_timeout must be positive"));
  EXPECT_TRUE(client::ClientOptions().Check().ok());
}

// Workers that pace every action to a slow emulated speed, so that a step takes seconds.
class SlowStepTest : public LivenessTest {
 protected:
  std::vector<std::string> WorkerFlags() const override { return {"--emulate-gflops", "0.0003"}; }
};

// Keepalive is no false alarm: a client pinging every second through a step during which no data
// moves for several seconds is neither refused by the coordinator (gRPC's default server policy
// would answer the third such ping with GOAWAY "too_many_pings" and end the step UNAVAILABLE; see
// coordinator::AllowClientKeepalive) nor told that the coordinator stopped answering.
TEST_F(SlowStepTest, PingsDuringALongStepAreAccepted) {
  absl::StatusOr<v1::JobStatus> job = CreateJob();
  ASSERT_TRUE(job.ok()) << job.status();
  client::ClientOptions options;
  options.keepalive_interval = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<client::Client>> c =
      client::Client::Connect(daemons_.address(), options);
  ASSERT_TRUE(c.ok()) << c.status();
  const Batch batch(16);
  const absl::Time start = absl::Now();
  const absl::StatusOr<v1::StepResult> step = (*c)->TrainStep(job->job(), batch.view());
  const absl::Duration took = absl::Now() - start;
  std::cout << "a step of " << absl::FormatDuration(took)
            << " with a ping every second: " << step.status() << "\n";
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_GE(took, absl::Seconds(5)) << "too short to have drawn several pings";
}

// The worker's side: an idle worker (no job, nothing on its control stream for many ping
// intervals) still notices a frozen coordinator through its own keepalive, ends the control
// stream and redials (gRPC stops pinging after two pings without data unless told otherwise).
class WorkerKeepaliveTest : public LivenessTest {
 protected:
  std::vector<std::string> WorkerFlags() const override { return {"--keepalive", "1s"}; }
};

TEST_F(WorkerKeepaliveTest, AnIdleWorkerNoticesAFrozenCoordinator) {
  // Idle for several ping intervals first: the situation the default ping budget gets wrong.
  absl::SleepFor(absl::Milliseconds(3500));  // the time that passes is what is tested.
  const std::string log = dir_ + "/worker-0.log";
  const auto [noticed, took] = WhileFrozen("the idle worker's control stream", [&] {
    const absl::Time deadline = absl::Now() + absl::Seconds(40);
    while (absl::Now() < deadline) {
      if (ReadFile(log).find("control stream to " + daemons_.address() + " ended") !=
          std::string::npos) {
        return true;
      }
      absl::SleepFor(absl::Milliseconds(50));  // polling a bounded wait.
    }
    return false;
  });
  EXPECT_TRUE(noticed) << ReadFile(log);
  EXPECT_LT(took, absl::Seconds(25));  // 1 s to the ping, at most 10 s for its answer.
}

}  // namespace
}  // namespace pipetrain
