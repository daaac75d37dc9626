// ProfileWorkers in the coordinator core (server/coordinator/profile_workers.cc) against fake
// workers: every idle worker is asked and answers apart; busy workers are skipped; a lost or
// silent worker gets its own error, never a hang.
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/coordinator/core_test_fixture.h"
#include "tests/server/coordinator/fake_worker.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::MakeSpec;

class ProfileWorkersTest : public testing::CoreTest {
 protected:
  // The fixture's model at micro-batches of 2 and 4 samples, 1 thread, a 10 s deadline.
  static v1::ProfileWorkersRequest Request() {
    v1::ProfileWorkersRequest r;
    *r.mutable_model() = MakeSpec(1, 1).model();
    r.add_samples(2);
    r.add_samples(4);
    r.set_threads(1);
    r.set_deadline_ms(10'000);
    return r;
  }

  // Starts ProfileWorkers; Await() gives its result.
  void Start(const v1::ProfileWorkersRequest& request) {
    core_->ProfileWorkers(request, [this](absl::StatusOr<v1::ProfileWorkersResponse> r) {
      result_ = std::move(r);
      done_.Notify();
    });
  }
  absl::StatusOr<v1::ProfileWorkersResponse> Await() {
    if (!done_.WaitForNotificationWithTimeout(absl::Seconds(30))) {
      return absl::DeadlineExceededError("ProfileWorkers never answered");
    }
    return result_;
  }
  // The status of a call made apart from Start (at most 30 s later).
  absl::Status SecondCallStatus(const v1::ProfileWorkersRequest& request) {
    struct Answer {
      absl::Notification done;
      absl::Status status;
    };
    auto answer = std::make_shared<Answer>();  // outlives a call that answers after the wait.
    core_->ProfileWorkers(request, [answer](absl::StatusOr<v1::ProfileWorkersResponse> got) {
      answer->status = got.status();
      answer->done.Notify();
    });
    if (!answer->done.WaitForNotificationWithTimeout(absl::Seconds(30))) {
      return absl::DeadlineExceededError("ProfileWorkers never answered");
    }
    return answer->status;
  }
  absl::StatusOr<v1::ProfileWorkersResponse> Profile(const v1::ProfileWorkersRequest& request) {
    Start(request);
    return Await();
  }

  absl::Notification done_;
  absl::StatusOr<v1::ProfileWorkersResponse> result_ = absl::UnknownError("not answered");
};

TEST_F(ProfileWorkersTest, EveryIdleWorkerAnswersWithItsOwnSecondsInRegistrationOrder) {
  AddWorkers(3);
  workers_[1]->SlowProfiles(2);
  absl::StatusOr<v1::ProfileWorkersResponse> r = Profile(Request());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->workers_size(), 3);
  EXPECT_FALSE(r->isa().empty());
  const int layers = MakeSpec(1, 1).model().layers_size();
  for (int w = 0; w < 3; ++w) {
    const v1::WorkerLayerProfile& p = r->workers(w);
    EXPECT_EQ(p.name(), absl::StrCat("w", w));
    EXPECT_EQ(p.code(), 0) << p.message();
    EXPECT_EQ(p.gflops(), 10);
    EXPECT_EQ(p.cpu_seconds(), 0.5);
    ASSERT_EQ(p.costs_size(), 2);
    EXPECT_EQ(p.costs(0).samples(), 2);
    EXPECT_EQ(p.costs(1).samples(), 4);
    ASSERT_EQ(p.costs(1).layers_size(), layers);
    // Layer 1 at 4 samples: F = factor x 1e-3 x 2 x 4.
    EXPECT_DOUBLE_EQ(p.costs(1).layers(1).forward(), (w == 1 ? 2 : 1) * 8e-3);
  }
  // What each worker was asked: the model, the sample counts, the threads and the chosen level.
  const v1::ProfileLayers asked = workers_[2]->profile();
  EXPECT_EQ(asked.model().layers_size(), layers);
  EXPECT_THAT(asked.samples(), ElementsAre(2, 4));
  EXPECT_EQ(asked.threads(), 1);
  EXPECT_EQ(asked.isa(), r->isa());
  EXPECT_EQ(asked.deadline_ms(), 10'000);
}

TEST_F(ProfileWorkersTest, WorkersInAJobAreNotAsked) {
  AddWorkers(3);
  ASSERT_TRUE(CreateJob(MakeSpec(1, 1)).ok());  // takes w0.
  absl::StatusOr<v1::ProfileWorkersResponse> r = Profile(Request());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->workers_size(), 2);
  EXPECT_EQ(r->workers(0).name(), "w1");
  EXPECT_EQ(r->workers(1).name(), "w2");
  for (const std::string& kind : workers_[0]->Received()) EXPECT_NE(kind, "profile_layers");
}

TEST_F(ProfileWorkersTest, ALostWorkerGetsUnavailableAndTheOthersTheirFigures) {
  AddWorkers(2);
  workers_[1]->HoldProfiles();
  Start(Request());
  ASSERT_TRUE(workers_[1]->WaitFor("profile_layers"));
  workers_[1]->Gone();
  absl::StatusOr<v1::ProfileWorkersResponse> r = Await();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->workers_size(), 2);
  EXPECT_EQ(r->workers(0).code(), 0);
  EXPECT_EQ(r->workers(0).costs_size(), 2);
  EXPECT_EQ(r->workers(1).code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_THAT(r->workers(1).message(), HasSubstr("'w1' was lost"));
  EXPECT_EQ(r->workers(1).costs_size(), 0);
}

TEST_F(ProfileWorkersTest, ASilentWorkerGetsDeadlineExceededAtTheDeadline) {
  AddWorkers(2);
  workers_[0]->HoldProfiles();
  v1::ProfileWorkersRequest request = Request();
  request.set_deadline_ms(200);
  absl::StatusOr<v1::ProfileWorkersResponse> r = Profile(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->workers(0).code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(r->workers(0).message(), HasSubstr("within 200 ms"));
  EXPECT_EQ(r->workers(1).code(), 0);
}

TEST_F(ProfileWorkersTest, AWorkersRefusalIsPassedOnInItsEntry) {
  AddWorkers(2);
  workers_[1]->FailProfiles(absl::InvalidArgumentError("ProfileLayers(1): model: layer 0 bad"));
  absl::StatusOr<v1::ProfileWorkersResponse> r = Profile(Request());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->workers(0).code(), 0);
  EXPECT_EQ(r->workers(1).code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(r->workers(1).message(), "ProfileLayers(1): model: layer 0 bad");
  EXPECT_EQ(r->workers(1).costs_size(), 0);
}

TEST_F(ProfileWorkersTest, ABadRequestOrNoIdleWorkerFailsTheCallBeforeAnyWorkerHearsOfIt) {
  AddWorkers(1);
  v1::ProfileWorkersRequest no_samples = Request();
  no_samples.clear_samples();
  absl::StatusOr<v1::ProfileWorkersResponse> r = Profile(no_samples);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("0 sample counts"));
  EXPECT_TRUE(workers_[0]->Received().empty());

  ASSERT_TRUE(CreateJob(MakeSpec(1, 1)).ok());
  const absl::Status status = SecondCallStatus(Request());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("no idle worker"));
}

TEST_F(ProfileWorkersTest, ASecondProfileWhileOneRunsIsRefused) {
  AddWorkers(1);
  workers_[0]->HoldProfiles();
  v1::ProfileWorkersRequest request = Request();
  request.set_deadline_ms(2'000);
  Start(request);
  ASSERT_TRUE(workers_[0]->WaitFor("profile_layers"));
  const absl::Status status = SecondCallStatus(Request());
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  workers_[0]->Gone();  // the first one then ends at once.
  ASSERT_TRUE(Await().ok());
}

}  // namespace
}  // namespace pipetrain::coordinator
