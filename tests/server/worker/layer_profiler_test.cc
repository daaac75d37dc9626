// LayerProfiler (server/worker/layer_profiler.h): a stage worker's timing of a model's layers for
// the coordinator's ProfileLayers -- the figures, the checks an Assign gets, one profile at a
// time, and a stop that ends it between sample counts.
#include "server/worker/layer_profiler.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/model/model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/model/test_models.h"

namespace pipetrain::worker {
namespace {

using ::testing::HasSubstr;

// The events a profiler emits, in order. Thread-safe.
class Events {
 public:
  void Add(v1::WorkerEvent e) {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(e));
  }
  // Waits (at most 60 s) for `n` events; the n-th's LayersProfiled.
  v1::LayersProfiled Await(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return events_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(60));
    return events_.size() >= n ? events_[n - 1].layers_profiled() : v1::LayersProfiled();
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::WorkerEvent> events_ ABSL_GUARDED_BY(mu_);
};

v1::ProfileLayers Command(int64_t profile, std::vector<int64_t> samples) {
  v1::ProfileLayers c;
  c.set_profile(profile);
  absl::StatusOr<v1::ModelSpec> model =
      model::ParseModelSpecText(model::testing::kMlpSpec, "kMlpSpec");
  EXPECT_TRUE(model.ok()) << model.status();
  *c.mutable_model() = *model;
  for (int64_t s : samples) c.add_samples(s);
  c.set_threads(1);
  c.mutable_optimizer()->mutable_sgd()->set_lr(0.1f);
  return c;
}

LayerProfilerOptions Options() {
  LayerProfilerOptions o;
  o.name = "w0";
  o.gflops = 12.5;
  o.threads_max = 2;
  return o;
}

TEST(LayerProfilerTest, TimesEveryLayerAtEverySampleCountInOrder) {
  Events events;
  LayerProfiler profiler(Options(), [&](v1::WorkerEvent e) { events.Add(std::move(e)); });
  profiler.Start(Command(7, {4, 1}));
  const v1::LayersProfiled p = events.Await(1);
  EXPECT_EQ(p.profile(), 7);
  ASSERT_EQ(p.code(), 0) << p.message();
  EXPECT_EQ(p.gflops(), 12.5);
  EXPECT_GT(p.cpu_seconds(), 0);
  ASSERT_EQ(p.costs_size(), 2);
  EXPECT_EQ(p.costs(0).samples(), 4);
  EXPECT_EQ(p.costs(1).samples(), 1);
  absl::StatusOr<v1::ModelSpec> spec =
      model::ParseModelSpecText(model::testing::kMlpSpec, "kMlpSpec");
  ASSERT_TRUE(spec.ok());
  absl::StatusOr<std::unique_ptr<model::Model>> net = model::Model::Build(*spec);
  ASSERT_TRUE(net.ok()) << net.status();
  for (const v1::SampleLayerCosts& c : p.costs()) {
    ASSERT_EQ(c.layers_size(), (*net)->num_layers());
    for (const v1::LayerSeconds& l : c.layers()) {
      EXPECT_GT(l.forward(), 0);
      EXPECT_GE(l.backward_input(), 0);
      EXPECT_GE(l.backward_weight(), 0);
    }
  }
  profiler.Stop("test over");
  EXPECT_FALSE(profiler.running());
}

TEST(LayerProfilerTest, ACommandAnAssignWouldBeRefusedForIsRefusedAtOnce) {
  Events events;
  LayerProfiler profiler(Options(), [&](v1::WorkerEvent e) { events.Add(std::move(e)); });
  v1::ProfileLayers bad_model = Command(1, {2});
  bad_model.mutable_model()->clear_layers();
  profiler.Start(bad_model);
  v1::LayersProfiled p = events.Await(1);
  EXPECT_EQ(p.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(p.message(), HasSubstr("ProfileLayers(1): model: "));
  EXPECT_FALSE(profiler.running());

  v1::ProfileLayers threads = Command(2, {2});
  threads.set_threads(3);  // threads_max is 2.
  profiler.Start(threads);
  p = events.Await(2);
  EXPECT_EQ(p.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(p.message(), HasSubstr("threads 3 is outside [1, 2]"));

  profiler.Start(Command(3, {}));
  p = events.Await(3);
  EXPECT_THAT(p.message(), HasSubstr("0 sample counts"));

  v1::ProfileLayers isa = Command(4, {2});
  isa.set_isa("x86-64-v9");
  profiler.Start(isa);
  p = events.Await(4);
  EXPECT_EQ(p.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(p.message(), HasSubstr("ProfileLayers(4): isa: "));
}

// A profile held before its first sample count: a second one is refused (UNAVAILABLE), and a
// stop ends the first with ABORTED before it times anything.
TEST(LayerProfilerTest, OneProfileAtATimeAndAStopEndsItBetweenSampleCounts) {
  Events events;
  absl::Notification entered, release;
  LayerProfilerOptions options = Options();
  options.before_sample_count = [&](int64_t) {
    if (!entered.HasBeenNotified()) entered.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(60));
  };
  LayerProfiler profiler(options, [&](v1::WorkerEvent e) { events.Add(std::move(e)); });
  profiler.Start(Command(1, {2, 2}));
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_TRUE(profiler.running());
  profiler.Start(Command(2, {2}));
  v1::LayersProfiled p = events.Await(1);
  EXPECT_EQ(p.profile(), 2);
  EXPECT_EQ(p.code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_THAT(p.message(), HasSubstr("running another layer profile"));
  profiler.RequestStop("an Assign arrived");
  release.Notify();
  profiler.Stop("the test ends");
  p = events.Await(2);
  EXPECT_EQ(p.profile(), 1);
  EXPECT_EQ(p.code(), static_cast<int>(absl::StatusCode::kAborted));
  EXPECT_THAT(p.message(), HasSubstr("stopped: an Assign arrived"));
  EXPECT_EQ(p.costs_size(), 0);
  EXPECT_FALSE(profiler.running());
}

TEST(LayerProfilerTest, APastDeadlineEndsTheProfileWithDeadlineExceeded) {
  Events events;
  LayerProfilerOptions options = Options();
  // Each sample count starts 5 ms later: the first is past the 1 ms deadline already.
  options.before_sample_count = [&](int64_t) { absl::SleepFor(absl::Milliseconds(5)); };
  LayerProfiler profiler(options, [&](v1::WorkerEvent e) { events.Add(std::move(e)); });
  v1::ProfileLayers c = Command(5, {2, 2});
  c.set_deadline_ms(1);
  profiler.Start(c);
  const v1::LayersProfiled p = events.Await(1);
  EXPECT_EQ(p.code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(p.message(), HasSubstr("timed 0 of 2 sample counts before its deadline"));
}

}  // namespace
}  // namespace pipetrain::worker
