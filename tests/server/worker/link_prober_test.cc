// LinkProber (server/worker/link_prober.h): a ProbeLinks command's targets measured in turn on the
// prober's thread, one LinksProbed per command; a target without an address, a second command
// while one runs and a command of too many targets get errors instead. Servers on 127.0.0.1 in
// this process stand for the other workers.
#include "server/worker/link_prober.h"

#include <grpcpp/grpcpp.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/link/exchange_service.h"
#include "tests/server/link/loopback_server.h"

namespace pipetrain::worker {
namespace {

using ::testing::HasSubstr;

// The events a prober emits. Thread-safe.
class Events {
 public:
  LinkProber::EmitFn Emit() {
    return [this](v1::WorkerEvent event) {
      absl::MutexLock lock(&mu_);
      events_.push_back(std::move(event));
    };
  }
  // The first `n` events, waiting (at most 30 s) for them.
  std::vector<v1::WorkerEvent> WaitFor(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return events_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30));
    return events_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::WorkerEvent> events_ ABSL_GUARDED_BY(mu_);
};

v1::ProbeLinks Targets(const std::vector<std::pair<std::string, std::string>>& targets) {
  v1::ProbeLinks command;
  for (const auto& [name, address] : targets) {
    v1::LinkProbeTarget* t = command.add_targets();
    t->set_name(name);
    t->set_address(address);
  }
  return command;
}

link::LinkProbeOptions Quick() {
  link::LinkProbeOptions o = WorkerProbeOptions(link::LinkOptions{});
  o.bulk_runs = 1;
  return o;
}

TEST(LinkProberTest, MeasuresEveryTargetInTurn) {
  link::ProbeAnswerer answerer;
  link::testing::LoopbackServer peer(
      [&answerer](const link::PeerHello& hello, std::unique_ptr<link::PeerLink> l) {
        return answerer.Accept(hello, std::move(l));
      });
  Events events;
  LinkProber prober("w1", nullptr, Quick(), events.Emit());
  prober.Start(Targets({{"w0", peer.Address()}, {"w2", ""}}));
  const std::vector<v1::WorkerEvent> got = events.WaitFor(1);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_TRUE(got[0].has_links_probed());
  const auto& links = got[0].links_probed().links();
  ASSERT_EQ(links.size(), 2);
  EXPECT_EQ(links[0].from(), "w1");
  EXPECT_EQ(links[0].to(), "w0");
  EXPECT_EQ(links[0].error(), "");
  for (const double x : {links[0].latency_seconds(), links[0].bytes_per_second(),
                         links[0].cpu_seconds_per_message()}) {
    EXPECT_TRUE(std::isfinite(x) && x > 0) << x;
  }
  EXPECT_EQ(links[1].to(), "w2");
  EXPECT_THAT(links[1].error(), HasSubstr("the target 'w2' at '' lacks a name or an address"));
  prober.Stop();
  answerer.Shutdown();
}

// A peer that takes the probe stream and never answers keeps the first probe running until its
// deadline (2 s), so the second command, sent right after, finds it running.
TEST(LinkProberTest, ACommandWhileProbingAndTooManyTargetsAreRefused) {
  std::vector<std::unique_ptr<link::PeerLink>> kept;
  absl::Mutex kept_mu;
  link::testing::LoopbackServer silent(
      [&](const link::PeerHello&,
          std::unique_ptr<link::PeerLink> l) -> absl::StatusOr<link::LinkSettings> {
        absl::MutexLock lock(&kept_mu);
        kept.push_back(std::move(l));
        link::LinkCallbacks callbacks;
        callbacks.on_tensor = [](const wire::TensorKey&, math::Matrix) { return absl::OkStatus(); };
        link::LinkSettings settings;
        settings.validation.expected = {link::kLinkProbeJob, link::kLinkProbeGeneration};
        settings.validation.num_chunks = 2;
        settings.callbacks = std::move(callbacks);
        return settings;
      });
  link::LinkProbeOptions options = Quick();
  options.timeout = absl::Seconds(2);
  Events events;
  LinkProber prober("w1", nullptr, options, events.Emit());
  prober.Start(Targets({{"w0", silent.Address()}}));
  prober.Start(Targets({{"w3", "127.0.0.1:1"}}));
  std::vector<std::pair<std::string, std::string>> many;
  for (int t = 0; t <= kMaxProbeTargets; ++t) many.emplace_back(absl::StrCat("w", t), "x:1");
  prober.Start(Targets(many));
  const std::vector<v1::WorkerEvent> got = events.WaitFor(3);
  ASSERT_EQ(got.size(), 3u);
  // The refusals come at once, in order; the silent peer's probe ends at its deadline.
  ASSERT_EQ(got[0].links_probed().links_size(), 1);
  EXPECT_EQ(got[0].links_probed().links(0).to(), "w3");
  EXPECT_EQ(got[0].links_probed().links(0).error(),
            "a probe of this worker's links is running already");
  EXPECT_EQ(got[1].links_probed().links_size(), kMaxProbeTargets + 1);
  EXPECT_EQ(got[1].links_probed().links(0).error(), "ProbeLinks names 65 targets; at most 64");
  ASSERT_EQ(got[2].links_probed().links_size(), 1);
  EXPECT_THAT(got[2].links_probed().links(0).error(), HasSubstr("DEADLINE_EXCEEDED"));
  prober.Stop();
  absl::MutexLock lock(&kept_mu);
  for (auto& l : kept) l->Shutdown();
}

}  // namespace
}  // namespace pipetrain::worker
