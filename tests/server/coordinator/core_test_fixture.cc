#include "tests/server/coordinator/core_test_fixture.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/model/model.h"

namespace pipetrain::coordinator::testing {

const char kTestModel[] = R"pb(
  input_features: 4
  layers { linear { out_features: 8 } }
  layers { relu {} }
  layers { linear { out_features: 3 } }
  loss { softmax_cross_entropy {} }
)pb";

v1::JobSpec MakeSpec(int stages, int microbatches, bool recover) {
  v1::JobSpec spec;
  absl::StatusOr<v1::ModelSpec> model = model::ParseModelSpecText(kTestModel, "test");
  EXPECT_TRUE(model.ok()) << model.status();
  *spec.mutable_model() = *model;
  spec.mutable_optimizer()->mutable_sgd()->set_lr(0.1f);
  spec.set_schedule("1f1b");
  spec.set_stages(stages);
  spec.set_microbatches(microbatches);
  spec.set_seed(1);
  spec.set_threads(1);
  spec.set_recover(recover);
  spec.set_replace_timeout_ms(5000);
  return spec;
}

v1::TrainRequest MakeBatch(const std::string& job, int samples, int64_t expected_steps_done) {
  v1::TrainRequest r;
  r.set_job(job);
  r.set_samples(samples);
  v1::DenseTensor* x = r.mutable_inputs();
  x->set_dtype(v1::DTYPE_F32);
  x->add_shape(samples);
  x->add_shape(4);
  std::vector<float> xs(static_cast<size_t>(samples) * 4);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = 0.01f * static_cast<float>(i);
  x->set_data(std::string(reinterpret_cast<const char*>(xs.data()), xs.size() * sizeof(float)));
  v1::DenseTensor* y = r.mutable_targets();
  y->set_dtype(v1::DTYPE_F32);
  y->add_shape(samples);
  y->add_shape(1);
  std::vector<float> ys(static_cast<size_t>(samples));
  for (size_t i = 0; i < ys.size(); ++i) ys[i] = static_cast<float>(i % 3);
  y->set_data(std::string(reinterpret_cast<const char*>(ys.data()), ys.size() * sizeof(float)));
  if (expected_steps_done >= 0) r.set_expected_steps_done(expected_steps_done);
  return r;
}

void CoreTest::SetUp() {
  root_ = ::testing::TempDir() + "core_test_" +
          ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::remove_all(root_);
  std::filesystem::create_directories(root_);
  links_ = std::make_shared<FakeFeedLinks>();
  core_ = std::make_unique<CoordinatorCore>(Options(), links_);
}

CoordinatorOptions CoreTest::Options() const {
  CoordinatorOptions options;
  options.checkpoint_root = root_;
  options.loss_grace = absl::Milliseconds(200);
  options.log = [](logging::LogLevel, const std::string&) {};
  Adjust(options);
  return options;
}

void CoreTest::ReplaceCore(const CoordinatorOptions& options) {
  workers_.clear();
  core_.reset();
  core_ = std::make_unique<CoordinatorCore>(options, links_);
}

void CoreTest::TearDown() {
  workers_.clear();  // their streams end before the core goes.
  core_.reset();
  std::filesystem::remove_all(root_);
}

void CoreTest::AddWorkers(int n) {
  for (int i = 0; i < n; ++i) {
    workers_.push_back(
        std::make_unique<FakeWorker>(core_.get(), absl::StrCat("w", workers_.size())));
    ASSERT_TRUE(workers_.back()->Register().ok());
  }
}

absl::StatusOr<v1::JobStatus> CoreTest::CreateJob(const v1::JobSpec& spec,
                                                  const std::string& owner) {
  absl::Notification done;
  absl::StatusOr<v1::JobStatus> result;
  core_->CreateJob(spec, owner, [&](absl::StatusOr<v1::JobStatus> status) {
    result = std::move(status);
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

absl::StatusOr<v1::StepResult> CoreTest::Step(const v1::TrainRequest& request) {
  absl::Notification done;
  absl::StatusOr<v1::StepResult> result = absl::UnknownError("not run");
  const absl::Status posted = core_->PostToJob(request.job(), [&] {
    result = core_->TrainStep(request, [] { return false; });
    done.Notify();
  });
  if (!posted.ok()) return posted;
  done.WaitForNotification();
  return result;
}

absl::StatusOr<v1::CheckpointResponse> CoreTest::Checkpoint(const std::string& job,
                                                            const std::string& dir) {
  v1::CheckpointRequest request;
  request.set_job(job);
  request.set_directory(dir);
  absl::Notification done;
  absl::StatusOr<v1::CheckpointResponse> result = absl::UnknownError("not run");
  const absl::Status posted = core_->PostToJob(job, [&] {
    result = core_->Checkpoint(request);
    done.Notify();
  });
  if (!posted.ok()) return posted;
  done.WaitForNotification();
  return result;
}

absl::StatusOr<v1::StepResult> CoreTest::ClientStep(const v1::TrainRequest& request) {
  return ClientRequest<v1::StepResult>(
      request.job(), [&] { return core_->TrainStep(request, [] { return false; }); });
}

absl::StatusOr<v1::CheckpointResponse> CoreTest::ClientCheckpoint(const std::string& job,
                                                                  const std::string& dir) {
  v1::CheckpointRequest request;
  request.set_job(job);
  request.set_directory(dir);
  return ClientRequest<v1::CheckpointResponse>(job, [&] { return core_->Checkpoint(request); });
}

absl::StatusOr<v1::JobStatus> CoreTest::AwaitJob(
    const std::string& job, const std::function<bool(const v1::JobStatus&)>& ready) {
  const absl::Time until = absl::Now() + absl::Seconds(10);
  for (;;) {
    absl::StatusOr<v1::JobStatus> status = core_->GetJob(job);
    if (!status.ok() || ready(*status) || absl::Now() > until) return status;
    absl::SleepFor(absl::Milliseconds(2));
  }
}

}  // namespace pipetrain::coordinator::testing
