// EstimateLinkLatency: the offset between two workers' clocks cancels, medians ignore outliers,
// tensors seen by one end only and one-way pairs are ignored.
#include "common/schedule/link_latency.h"

#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain::schedule {
namespace {

constexpr int kActivation = 1;
constexpr int kGradient = 2;

// Tensor (mb, chunk, kind) from worker `from` to `to`: sent at `send_start` on the sender's
// clock, received whole at `receive_end` on the receiver's.
void AddTransfer(std::vector<LinkObservation>* obs, int from, int to, int kind, int mb, int chunk,
                 double send_start, double receive_end) {
  obs->push_back(LinkObservation{true, from, to, kind, mb, chunk, send_start, send_start + 0.01});
  obs->push_back(
      LinkObservation{false, to, from, kind, mb, chunk, receive_end - 0.02, receive_end});
}

TEST(LinkLatencyTest, TheClockOffsetCancels) {
  // True one-way latency 0.3; worker 1's clock reads 5.0 less than worker 0's.
  const double latency = 0.3, offset = -5.0;
  std::vector<LinkObservation> obs;
  for (int mb = 0; mb < 4; ++mb) {
    const double t = 10.0 * mb;  // on worker 0's clock.
    AddTransfer(&obs, 0, 1, kActivation, mb, 0, t, t + latency + offset);
    AddTransfer(&obs, 1, 0, kGradient, mb, 0, t + 2 + offset, t + 2 + latency);
  }
  const std::optional<double> got = EstimateLinkLatency(obs);
  ASSERT_TRUE(got.has_value());
  EXPECT_NEAR(*got, latency, 1e-12);
}

TEST(LinkLatencyTest, MediansIgnoreAnOutlierAndDirectionsMayDiffer) {
  std::vector<LinkObservation> obs;
  // Forward delays 0.2, 0.2, 9.0 (one tensor queued behind others): median 0.2. Back: 0.4.
  const double forward[] = {0.2, 0.2, 9.0};
  for (int mb = 0; mb < 3; ++mb) {
    AddTransfer(&obs, 0, 1, kActivation, mb, 0, mb, mb + forward[mb]);
    AddTransfer(&obs, 1, 0, kGradient, mb, 0, 20 + mb, 20 + mb + 0.4);
  }
  const std::optional<double> got = EstimateLinkLatency(obs);
  ASSERT_TRUE(got.has_value());
  EXPECT_NEAR(*got, 0.3, 1e-12);
}

TEST(LinkLatencyTest, MedianOverPairsOfWorkers) {
  std::vector<LinkObservation> obs;
  // Pairs (0,1), (1,2), (2,3) with latencies 0.1, 0.5, 0.2: the median is 0.2.
  const double latency[] = {0.1, 0.5, 0.2};
  for (int w = 0; w < 3; ++w) {
    AddTransfer(&obs, w, w + 1, kActivation, 0, w, 1, 1 + latency[w]);
    AddTransfer(&obs, w + 1, w, kGradient, 0, w, 5, 5 + latency[w]);
  }
  const std::optional<double> got = EstimateLinkLatency(obs);
  ASSERT_TRUE(got.has_value());
  EXPECT_NEAR(*got, 0.2, 1e-12);
}

TEST(LinkLatencyTest, NothingToEstimateFrom) {
  EXPECT_FALSE(EstimateLinkLatency({}).has_value());
  std::vector<LinkObservation> obs;
  // One way only: the offset cannot be told from the latency.
  AddTransfer(&obs, 0, 1, kActivation, 0, 0, 1, 2);
  EXPECT_FALSE(EstimateLinkLatency(obs).has_value());
  // The way back seen by the sender only (its receiver's report is missing).
  obs.push_back(LinkObservation{true, 1, 0, kGradient, 0, 0, 3, 3.1});
  EXPECT_FALSE(EstimateLinkLatency(obs).has_value());
  // A different tensor received does not match it either.
  obs.push_back(LinkObservation{false, 0, 1, kGradient, 1, 0, 3.2, 3.4});
  EXPECT_FALSE(EstimateLinkLatency(obs).has_value());
}

TEST(LinkLatencyTest, NeverNegative) {
  // Apparent delays whose mean is negative (clock jitter larger than the latency): 0.
  std::vector<LinkObservation> obs;
  AddTransfer(&obs, 0, 1, kActivation, 0, 0, 1, 0.5);
  AddTransfer(&obs, 1, 0, kGradient, 0, 0, 2, 1.9);
  const std::optional<double> got = EstimateLinkLatency(obs);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, 0.0);
}

// Times that are not finite (a corrupt report) are ignored, never sorted: a NaN breaks the
// ordering std::nth_element relies on. Delays whose difference overflows are ignored too.
TEST(LinkLatencyTest, NonFiniteTimesAreIgnored) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<LinkObservation> obs;
  for (int mb = 0; mb < 3; ++mb) {
    AddTransfer(&obs, 0, 1, kActivation, mb, 0, 10.0 * mb, 10.0 * mb + 0.5);
    AddTransfer(&obs, 1, 0, kGradient, mb, 0, 10.0 * mb + 5, 10.0 * mb + 5.5);
  }
  AddTransfer(&obs, 0, 1, kActivation, 3, 0, nan, 1);
  AddTransfer(&obs, 0, 1, kActivation, 4, 0, 1, inf);
  AddTransfer(&obs, 1, 0, kGradient, 5, 0, -1.7e308, 1.7e308);  // the delay overflows.
  for (int i = 0; i < 16; ++i) AddTransfer(&obs, 1, 0, kGradient, 6 + i, 0, nan, nan);
  const std::optional<double> latency = EstimateLinkLatency(obs);
  ASSERT_TRUE(latency.has_value());
  EXPECT_DOUBLE_EQ(*latency, 0.5);

  std::vector<LinkObservation> only_bad;
  AddTransfer(&only_bad, 0, 1, kActivation, 0, 0, nan, 1);
  AddTransfer(&only_bad, 1, 0, kGradient, 0, 0, 1, inf);
  EXPECT_FALSE(EstimateLinkLatency(only_bad).has_value());
}

}  // namespace
}  // namespace pipetrain::schedule
