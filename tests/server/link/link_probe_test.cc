// The link probe (server/link/link_probe.h): this host's loopback link measured through a real
// PeerLink and ExchangeService gives positive, finite figures; bad options and a probe that runs
// out of time are errors that say so.
#include "server/link/link_probe.h"

#include <grpcpp/grpcpp.h>

#include <cmath>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/link/exchange_service.h"
#include "tests/server/link/loopback_server.h"

namespace pipetrain::link {
namespace {

using ::testing::HasSubstr;

void ExpectPositiveAndFinite(const LinkMeasurement& m) {
  for (const double x : {m.latency_seconds, m.bytes_per_second, m.cpu_seconds_per_message}) {
    EXPECT_TRUE(std::isfinite(x)) << x;
    EXPECT_GT(x, 0) << x;
  }
}

TEST(LinkProbeTest, MeasuresTheLoopbackLink) {
  const LinkProbeOptions options;
  absl::StatusOr<LinkMeasurement> m = MeasureLoopbackLink(options);
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectPositiveAndFinite(*m);
  EXPECT_EQ(m->round_trips, 64);
  EXPECT_EQ(m->bulk_bytes, int64_t{5} * 8 * (int64_t{4} << 20));
  // Loose bounds a loopback link meets on any host, however loaded: a round trip of a small
  // tensor within a second, more than 1 MB/s, less than a second of CPU per tensor.
  EXPECT_LT(m->latency_seconds, 1.0);
  EXPECT_GT(m->bytes_per_second, 1e6);
  EXPECT_LT(m->cpu_seconds_per_message, 1.0);
}

TEST(LinkProbeTest, TheSmallestProbeMeasuresToo) {
  LinkProbeOptions options;
  options.round_trips = 4;
  options.small_bytes = 4;
  options.bulk_bytes = int64_t{64} << 10;
  options.bulk_tensors = 1;
  options.bulk_runs = 1;
  absl::StatusOr<LinkMeasurement> m = MeasureLoopbackLink(options);
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectPositiveAndFinite(*m);
  EXPECT_EQ(m->round_trips, 4);
  EXPECT_EQ(m->bulk_bytes, int64_t{64} << 10);
}

TEST(LinkProbeTest, RefusesBadOptionsNamingTheField) {
  const auto refused = [](LinkProbeOptions o, const std::string& what) {
    absl::Status s = MeasureLoopbackLink(o).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(what));
  };
  LinkProbeOptions o;
  o.round_trips = 3;
  refused(o, "LinkProbeOptions.round_trips must be in [4, 10000], got 3");
  o = {};
  o.small_bytes = 6;
  refused(o, "LinkProbeOptions.small_bytes must be in [4, 65536] and a multiple of 4, got 6");
  o = {};
  o.bulk_bytes = (int64_t{64} << 20) + 4096;
  refused(o, "LinkProbeOptions.bulk_bytes must be in [65536, 67108864]");
  o = {};
  o.bulk_tensors = 0;
  refused(o, "LinkProbeOptions.bulk_tensors must be in [1, 1024], got 0");
  o = {};
  o.bulk_runs = 101;
  refused(o, "LinkProbeOptions.bulk_runs must be in [1, 100], got 101");
  o = {};
  o.timeout = absl::ZeroDuration();
  refused(o, "LinkProbeOptions.timeout must be in (0, 1h], got 0");
  o = {};
  o.link.fragment_bytes = 1;
  refused(o, "link fragment_bytes 1 outside");
}

// A deadline no loopback round trip can meet: the probe stops at the first answer it waits for.
TEST(LinkProbeTest, AProbeOutOfTimeIsDeadlineExceeded) {
  LinkProbeOptions o;
  o.timeout = absl::Nanoseconds(1);
  absl::Status s = MeasureLoopbackLink(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("link probe: out of time (1ns) waiting for the answer to tensor 0 on the "
                        "link to loopback 127.0.0.1:"));
}

// Across processes' worth of code: a server that hands probe streams to a ProbeAnswerer (as a
// stage worker does) is measured from the dialling end alone.
TEST(LinkProbeTest, MeasuresAPeerThatAnswersProbeStreams) {
  ProbeAnswerer answerer;
  testing::LoopbackServer server(
      [&answerer](const PeerHello& hello, std::unique_ptr<PeerLink> link) {
        return answerer.Accept(hello, std::move(link));
      });
  LinkProbeOptions options;
  options.bulk_runs = 2;
  absl::StatusOr<LinkMeasurement> m = MeasurePeerLink(CreateExchangeChannel(server.Address()),
                                                      server.Address(), "worker-a", options);
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectPositiveAndFinite(*m);
  EXPECT_EQ(m->bulk_bytes, int64_t{2} * 8 * (int64_t{4} << 20));
  // The answerer served the stream and let it go: a second probe is served too.
  m = MeasurePeerLink(CreateExchangeChannel(server.Address()), server.Address(), "worker-a",
                      options);
  ASSERT_TRUE(m.ok()) << m.status();
  answerer.Shutdown();
}

TEST(LinkProbeTest, TheAnswererRefusesStreamsOfAJob) {
  ProbeAnswerer answerer;
  PeerHello hello{"stage/0", wire::StreamIdentity{"job-1", 1}, ""};
  absl::Status s = answerer.Accept(hello, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("a probe stream from 'stage/0' names job 'job-1' generation 1"));
}

// A peer that refuses the probe stream (a worker without a probe answerer) fails the probe with
// the peer's status.
TEST(LinkProbeTest, APeerThatRefusesTheStreamFailsTheProbeWithItsStatus) {
  testing::LoopbackServer server(
      [](const PeerHello&, std::unique_ptr<PeerLink>) -> absl::StatusOr<LinkSettings> {
        return absl::AbortedError("worker w has no job");
      });
  absl::Status s =
      MeasurePeerLink(CreateExchangeChannel(server.Address()), "w", "worker-a").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("link probe: the link to w failed: "));
  EXPECT_THAT(std::string(s.message()), HasSubstr("worker w has no job"));
}

}  // namespace
}  // namespace pipetrain::link
