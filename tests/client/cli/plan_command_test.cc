// `pipetrain plan`'s options, its choice for --plan auto and its table (client/cli/plan_command.h).
#include "client/cli/plan_command.h"

#include <cmath>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pipetrain::cli {
namespace {

plan::PlanChoice Choice(int stages, schedule::ScheduleKind kind, int m, double sps, bool fits,
                        double peak) {
  plan::PlanChoice p;
  p.stages = stages;
  p.kind = kind;
  p.microbatches = m;
  p.samples_per_second = sps;
  p.step_seconds = 64 / sps;
  p.bubble = 0.125;
  p.imbalance = 1.04;
  p.fits_memory = fits;
  p.peak_memory_bytes.assign(stages, peak);
  return p;
}

PlanResult Result() {
  PlanResult r;
  r.batch = 64;
  r.local_gflops = 100;
  r.workers = {{"a", 100, 1 << 30}, {"b", 100, 1 << 30}};
  r.plans = {Choice(2, schedule::ScheduleKind::kZbH1, 16, 2400, true, 3 << 20),
             Choice(2, schedule::ScheduleKind::kOneFOneB, 1, 420, true, 1 << 20)};
  return r;
}

TEST(PlanCommandTest, BestPlanIsTheFirstThatFits) {
  absl::StatusOr<plan::PlanChoice> best = BestPlan(Result());
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->kind, schedule::ScheduleKind::kZbH1);
  EXPECT_EQ(best->microbatches, 16);
}

// --plan auto skips plans of more replicas than it may run (kAutoPlanMaxReplicas); the table
// lists them with their reduction.
TEST(PlanCommandTest, BestPlanKeepsToTheReplicasItMayRun) {
  PlanResult r = Result();
  plan::PlanChoice two = Choice(1, schedule::ScheduleKind::kGPipe, 16, 3000, true, 1 << 20);
  two.replicas = 2;
  two.reduction_seconds = 1.5e-3;
  r.plans.insert(r.plans.begin(), two);
  absl::StatusOr<plan::PlanChoice> best = BestPlan(r, 1);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->replicas, 1);
  EXPECT_EQ(best->kind, schedule::ScheduleKind::kZbH1);
  best = BestPlan(r, 2);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->replicas, 2);
  const std::string text = FormatPlans(r, 1, false);
  EXPECT_NE(text.find("REDUCE MS"), std::string::npos) << text;
  EXPECT_NE(text.find("1    2        1      gpipe"), std::string::npos) << text;
  EXPECT_NE(text.find(" 1.50 "), std::string::npos) << text;
}

TEST(PlanCommandTest, NoPlanFitsIsAnErrorNamingTheSmallestNeed) {
  PlanResult r = Result();
  for (plan::PlanChoice& p : r.plans) p.fits_memory = false;
  absl::Status s = BestPlan(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("the smallest needs 1.0 MiB"), std::string::npos) << s;
}

TEST(PlanCommandTest, TableHasAReplicaColumnAndEveryPlan) {
  const std::string text = FormatPlans(Result(), 10, false);
  EXPECT_NE(text.find("2 plans for batch 64 on 2 workers (a 100.0 GFLOP/s 1.0 GiB"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("REPLICAS STAGES SCHEDULE"), std::string::npos) << text;
  EXPECT_NE(text.find("zb-h1"), std::string::npos) << text;
  EXPECT_NE(text.find("2400"), std::string::npos) << text;
  EXPECT_NE(text.find("12.5%"), std::string::npos) << text;
  EXPECT_NE(text.find("3.0 MiB"), std::string::npos) << text;
  // --top 1: the header and one plan.
  const std::string top = FormatPlans(Result(), 1, false);
  EXPECT_EQ(top.find("1f1b "), std::string::npos) << top;
  const std::string json = FormatPlans(Result(), 10, true);
  EXPECT_NE(json.find("{\"rank\":1,\"replicas\":1,\"stages\":2,\"schedule\":\"zb-h1\""),
            std::string::npos)
      << json;
}

TEST(PlanCommandTest, RefusesBadOptionsBeforeMeasuring) {
  PlanCommandOptions o;
  o.training.model_path = "examples/gpt_char.textproto";
  absl::Status neither = ComputePlans(o).status();
  EXPECT_EQ(neither.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(neither.message().find("give exactly one of --local N"), std::string::npos) << neither;
  o.local_workers = 2;
  o.coordinator = "127.0.0.1:1";
  EXPECT_EQ(ComputePlans(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.coordinator.clear();
  o.link_bytes_per_second = -1;
  absl::Status bw = ComputePlans(o).status();
  EXPECT_NE(bw.message().find("--link-bandwidth"), std::string::npos) << bw;
  o.link_bytes_per_second = 0;
  o.message_cpu_seconds = -1;
  absl::Status cpu = ComputePlans(o).status();
  EXPECT_NE(cpu.message().find("--message-cpu"), std::string::npos) << cpu;
  o.message_cpu_seconds = 0;
  o.link_latency_seconds = -1e-6;
  absl::Status latency = ComputePlans(o).status();
  EXPECT_NE(latency.message().find("--link-latency must be in [0, 1e6]"), std::string::npos)
      << latency;
  o.link_latency_seconds.reset();
  o.top = 0;
  EXPECT_NE(ComputePlans(o).status().message().find("--top"), std::string::npos);
}

using ::testing::HasSubstr;

PlanLinkFigures Figures(LinkFigureSource latency, LinkFigureSource bandwidth,
                        LinkFigureSource cpu) {
  PlanLinkFigures f;
  f.costs = {45e-6, 2.1e9, 3.25e-6};
  f.latency = latency;
  f.bandwidth = bandwidth;
  f.message_cpu = cpu;
  return f;
}

TEST(PlanCommandTest, LinkFiguresSayWhereTheyCameFrom) {
  using S = LinkFigureSource;
  PlanLinkFigures measured = Figures(S::kMeasured, S::kMeasured, S::kMeasured);
  measured.measured_on = "this host's loopback link";
  EXPECT_EQ(LinkFiguresText(measured),
            "link measured: 45 us, 2.1 GB/s, 3.2 us CPU per message (this host's loopback link)");
  EXPECT_EQ(LinkFiguresText(Figures(S::kGiven, S::kGiven, S::kGiven)),
            "link given: 45 us, 2.1 GB/s, 3.2 us CPU per message");
  EXPECT_THAT(LinkFiguresText(Figures(S::kDefault, S::kDefault, S::kDefault)),
              HasSubstr("link default: 45 us, 2.1 GB/s, 3.2 us CPU per message (no link "
                        "between the coordinator's workers was measured"));
  PlanLinkFigures mixed = Figures(S::kMeasured, S::kGiven, S::kMeasured);
  mixed.costs.bytes_per_second = 12.5e6;
  EXPECT_EQ(LinkFiguresText(mixed),
            "link: 45 us measured, 12.5 MB/s given, 3.2 us CPU per message measured");
  mixed.costs.bytes_per_second = 0;
  EXPECT_THAT(LinkFiguresText(mixed), HasSubstr("infinite bandwidth given"));
}

v1::MeasuredLink Link(const std::string& from, const std::string& to, double latency,
                      double bandwidth, double cpu, const std::string& error = "") {
  v1::MeasuredLink l;
  l.set_from(from);
  l.set_to(to);
  l.set_latency_seconds(latency);
  l.set_bytes_per_second(bandwidth);
  l.set_cpu_seconds_per_message(cpu);
  l.set_error(error);
  return l;
}

// The worst of the measured links between the plan's workers goes to the figures, each measured
// pair keeps its own latency and bandwidth (both ways), an unmeasured pair gets the worst; a
// failed probe, or a link to a worker not planned for, counts for nothing.
TEST(PlanCommandTest, MeasuredLinksGiveTheWorstAndEachPairItsOwn) {
  const std::vector<plan::WorkerResources> workers = {{"a", 1, 0}, {"b", 1, 0}, {"c", 1, 0}};
  PlanLinkFigures f;
  ApplyMeasuredLinks({Link("b", "a", 1e-4, 2e9, 2e-5), Link("c", "a", 5e-4, 1e9, 1e-5),
                      Link("c", "b", 9, 1, 9, "DEADLINE_EXCEEDED"), Link("x", "a", 9, 1, 9)},
                     workers, &f);
  EXPECT_EQ(f.latency, LinkFigureSource::kMeasured);
  EXPECT_EQ(f.measured_on,
            "the worst of 2 measured links between the coordinator's workers; each measured "
            "pair's own latency and bandwidth in the plans");
  EXPECT_DOUBLE_EQ(f.costs.latency_seconds, 5e-4);
  EXPECT_DOUBLE_EQ(f.costs.bytes_per_second, 1e9);
  EXPECT_DOUBLE_EQ(f.costs.cpu_seconds_per_message, 2e-5);
  ASSERT_EQ(f.pairs.size(), 3u);
  EXPECT_DOUBLE_EQ(f.pairs[0][1].latency_seconds, 1e-4);  // a-b, measured b -> a
  EXPECT_DOUBLE_EQ(f.pairs[1][0].bytes_per_second, 2e9);
  EXPECT_DOUBLE_EQ(f.pairs[2][0].latency_seconds, 5e-4);
  EXPECT_DOUBLE_EQ(f.pairs[1][2].latency_seconds, 5e-4);  // b-c failed: the worst
  EXPECT_DOUBLE_EQ(f.pairs[1][2].bytes_per_second, 1e9);
  for (const auto& row : f.pairs) {
    for (const plan::LinkCosts& l : row) EXPECT_DOUBLE_EQ(l.cpu_seconds_per_message, 2e-5);
  }
  PlanLinkFigures none;
  ApplyMeasuredLinks({Link("c", "b", 9, 1, 9, "UNAVAILABLE")}, workers, &none);
  EXPECT_EQ(none.latency, LinkFigureSource::kDefault);
  EXPECT_TRUE(none.pairs.empty());
}

TEST(PlanCommandTest, TableAndJsonNameTheLinkFigures) {
  PlanResult r = Result();
  r.link = Figures(LinkFigureSource::kGiven, LinkFigureSource::kGiven, LinkFigureSource::kGiven);
  EXPECT_THAT(FormatPlans(r, 10, false),
              HasSubstr("GFLOP/s\nlink given: 45 us, 2.1 GB/s, 3.2 us CPU per message\n#"));
  const std::string json = FormatPlans(r, 1, true);
  const nlohmann::json j = nlohmann::json::parse(json);
  EXPECT_DOUBLE_EQ(j["link"]["latency_seconds"].get<double>(), 45e-6);
  EXPECT_DOUBLE_EQ(j["link"]["bytes_per_second"].get<double>(), 2.1e9);
  EXPECT_DOUBLE_EQ(j["link"]["cpu_seconds_per_message"].get<double>(), 3.25e-6);
  EXPECT_EQ(j["link"]["latency_source"], "given");
}

// Plans for two workers on this host of the small digits MLP (each ComputePlans times its
// layers: about a second).
PlanCommandOptions LocalDigits() {
  PlanCommandOptions o;
  o.training.model_path = PIPETRAIN_SOURCE_DIR "/examples/mlp_digits.textproto";
  o.training.data_dir = PIPETRAIN_SOURCE_DIR "/data";
  o.training.batch = 8;
  o.local_workers = 2;
  o.max_microbatches = 2;
  return o;
}

// Unset, the link figures are measured on the loopback link: positive and finite, and what
// every plan was simulated with.
TEST(PlanCommandTest, LocalPlansMeasureTheLinkWhenNotGiven) {
  absl::StatusOr<PlanResult> r = ComputePlans(LocalDigits());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->link.latency, LinkFigureSource::kMeasured);
  EXPECT_EQ(r->link.bandwidth, LinkFigureSource::kMeasured);
  EXPECT_EQ(r->link.message_cpu, LinkFigureSource::kMeasured);
  for (const double x : {r->link.costs.latency_seconds, r->link.costs.bytes_per_second,
                         r->link.costs.cpu_seconds_per_message}) {
    EXPECT_TRUE(std::isfinite(x) && x > 0) << x;
  }
  ASSERT_FALSE(r->plans.empty());
  EXPECT_THAT(FormatPlans(*r, 1, false), HasSubstr("link measured: "));
}

// Given, a figure overrides the measurement; the others are still measured.
TEST(PlanCommandTest, GivenLinkFiguresOverrideTheMeasurement) {
  PlanCommandOptions o = LocalDigits();
  o.link_bytes_per_second = 0;
  o.message_cpu_seconds = 7e-6;
  absl::StatusOr<PlanResult> r = ComputePlans(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->link.latency, LinkFigureSource::kMeasured);
  EXPECT_GT(r->link.costs.latency_seconds, 0);
  EXPECT_EQ(r->link.bandwidth, LinkFigureSource::kGiven);
  EXPECT_EQ(r->link.costs.bytes_per_second, 0);
  EXPECT_EQ(r->link.message_cpu, LinkFigureSource::kGiven);
  EXPECT_EQ(r->link.costs.cpu_seconds_per_message, 7e-6);
}

// A probe that fails is an error naming the flags that plan without it; with all three given
// the probe is not run and the plans are made (the same failing probe options).
TEST(PlanCommandTest, AFailedProbeSaysHowToPlanWithoutIt) {
  PlanCommandOptions o = LocalDigits();
  o.link_probe.timeout = absl::Nanoseconds(1);  // no round trip meets it.
  o.link_latency_seconds = 50e-6;
  absl::Status failed = ComputePlans(o).status();
  EXPECT_EQ(failed.code(), absl::StatusCode::kDeadlineExceeded) << failed;
  EXPECT_THAT(
      std::string(failed.message()),
      HasSubstr("measuring this host's loopback link for the plans failed (give "
                "--link-latency, --link-bandwidth and --message-cpu to plan without "
                "measuring): link probe: out of time (1ns) waiting for the answer to tensor 0"));
  o.link_bytes_per_second = 1e9;
  o.message_cpu_seconds = 20e-6;
  absl::StatusOr<PlanResult> r = ComputePlans(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->link.costs.latency_seconds, 50e-6);
  EXPECT_EQ(r->link.costs.bytes_per_second, 1e9);
  EXPECT_EQ(r->link.costs.cpu_seconds_per_message, 20e-6);
  EXPECT_EQ(LinkFiguresText(r->link), "link given: 50 us, 1.0 GB/s, 20 us CPU per message");
}

}  // namespace
}  // namespace pipetrain::cli
