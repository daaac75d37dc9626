#include "server/metrics/worker_metrics.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::metrics {
namespace {

using ::testing::Optional;

TEST(WorkerMetricsTest, BusySecondsPerKind) {
  MetricsRegistry r("stage_worker");
  WorkerMetrics m(r);
  m.AddBusy("F", 0.5);
  m.AddBusy("F", 0.25);
  m.AddBusy("W", 1);
  const std::string t = r.TextExposition();
  EXPECT_THAT(SampleValue(t, "pipetrain_worker_busy_seconds_total", {{"kind", "F"}}),
              Optional(0.75));
  EXPECT_THAT(SampleValue(t, "pipetrain_worker_busy_seconds_total", {{"kind", "W"}}),
              Optional(1.0));
  // Every kind is exported from the start (0 until used).
  EXPECT_THAT(SampleValue(t, "pipetrain_worker_busy_seconds_total", {{"kind", "I"}}),
              Optional(0.0));
}

TEST(WorkerMetricsTest, LinksAddTheirGrowthPerPeer) {
  MetricsRegistry r("stage_worker");
  WorkerMetrics m(r);
  int link_a = 0, link_b = 0;
  m.UpdateLink(&link_a, "stage/1", {100, 10, 2, 1});
  m.UpdateLink(&link_a, "stage/1", {250, 10, 5, 1});  // +150 bytes, +3 tensors sent.
  m.ForgetLink(&link_a);
  // A new link (next generation) to the same peer starts its own count.
  m.UpdateLink(&link_b, "stage/1", {40, 4, 1, 1});
  m.UpdateLink(&link_a, "coordinator", {0, 8, 0, 2});
  const std::string t = r.TextExposition();
  EXPECT_THAT(SampleValue(t, "pipetrain_link_sent_bytes_total", {{"peer", "stage/1"}}),
              Optional(290.0));
  EXPECT_THAT(SampleValue(t, "pipetrain_link_received_bytes_total", {{"peer", "stage/1"}}),
              Optional(14.0));
  EXPECT_THAT(SampleValue(t, "pipetrain_link_sent_tensors_total", {{"peer", "stage/1"}}),
              Optional(6.0));
  EXPECT_THAT(SampleValue(t, "pipetrain_link_received_tensors_total", {{"peer", "coordinator"}}),
              Optional(2.0));
}

TEST(WorkerMetricsTest, Gauges) {
  MetricsRegistry r("stage_worker");
  WorkerMetrics m(r);
  m.SetMailbox(3, 4096);
  m.SetStashedBytes(1 << 20);
  const std::string t = r.TextExposition();
  EXPECT_THAT(SampleValue(t, "pipetrain_worker_mailbox_tensors"), Optional(3.0));
  EXPECT_THAT(SampleValue(t, "pipetrain_worker_mailbox_bytes"), Optional(4096.0));
  EXPECT_THAT(SampleValue(t, "pipetrain_worker_stashed_activation_bytes"),
              Optional(double{1 << 20}));
}

}  // namespace
}  // namespace pipetrain::metrics
