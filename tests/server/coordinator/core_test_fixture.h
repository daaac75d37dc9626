// What the coordinator core's tests share: a small model's job spec and batches, and a fixture
// holding a CoordinatorCore with fake workers and feed links (no sockets).
#ifndef PIPETRAIN_TESTS_SERVER_COORDINATOR_CORE_TEST_FIXTURE_H_
#define PIPETRAIN_TESTS_SERVER_COORDINATOR_CORE_TEST_FIXTURE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "server/coordinator/coordinator_core.h"
#include "tests/server/coordinator/fake_worker.h"

namespace pipetrain::coordinator::testing {

// A 4-8-3 MLP (ReLU, softmax cross-entropy), as model text.
extern const char kTestModel[];

// A job training kTestModel over `stages` stages: 1F1B, `microbatches`, SGD, seed 1, one
// thread, a 5 s replace timeout.
v1::JobSpec MakeSpec(int stages, int microbatches, bool recover = false);

// A batch of `samples` rows of 4 features with class labels 0..2 (expected_steps_done unset when
// negative).
v1::TrainRequest MakeBatch(const std::string& job, int samples, int64_t expected_steps_done = -1);

class CoreTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  // The core's options for this test (SetUp's defaults adjusted).
  virtual void Adjust(CoordinatorOptions& options) const {}
  // The options of every test's core: checkpoints under root_, no log lines; then Adjust.
  CoordinatorOptions Options() const;
  // Replaces the core (with no workers registered yet) by one with `options`.
  void ReplaceCore(const CoordinatorOptions& options);

  // Starts n fake workers named w<index> and registers them.
  void AddWorkers(int n);
  absl::StatusOr<v1::JobStatus> CreateJob(const v1::JobSpec& spec, const std::string& owner = "");
  // One step on the job's thread, as the Train stream runs it.
  absl::StatusOr<v1::StepResult> Step(const v1::TrainRequest& request);
  absl::StatusOr<v1::CheckpointResponse> Checkpoint(const std::string& job, const std::string& dir);
  // A client's request as the gRPC shell posts it (PostClientRequest): `run` on the job's thread
  // and its result, or the refusal of the post (then `run` never runs).
  template <typename T>
  absl::StatusOr<T> ClientRequest(const std::string& job,
                                  const std::function<absl::StatusOr<T>()>& run) {
    absl::Notification done;
    absl::StatusOr<T> result = absl::UnknownError("not run");
    const absl::Status posted = core_->PostClientRequest(job, [&] {
      result = run();
      done.Notify();
    });
    if (!posted.ok()) return posted;
    done.WaitForNotification();
    return result;
  }
  absl::StatusOr<v1::StepResult> ClientStep(const v1::TrainRequest& request);
  absl::StatusOr<v1::CheckpointResponse> ClientCheckpoint(const std::string& job,
                                                          const std::string& dir);
  // Polls the job's status until `ready` holds (at most 10 s).
  absl::StatusOr<v1::JobStatus> AwaitJob(const std::string& job,
                                         const std::function<bool(const v1::JobStatus&)>& ready);
  // Polls the job's status until it is READY after exactly `recoveries` recoveries (at most 10 s).
  absl::StatusOr<v1::JobStatus> AwaitRecovered(const std::string& job, int recoveries = 1) {
    return AwaitJob(job, [recoveries](const v1::JobStatus& s) {
      return s.state() == v1::JOB_STATE_READY && s.recoveries_size() == recoveries;
    });
  }

  std::string root_;
  std::shared_ptr<FakeFeedLinks> links_;
  std::unique_ptr<CoordinatorCore> core_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
};

}  // namespace pipetrain::coordinator::testing

#endif  // PIPETRAIN_TESTS_SERVER_COORDINATOR_CORE_TEST_FIXTURE_H_
