// The links between a coordinator's workers, measured by the workers (issue 30): real daemons on
// 127.0.0.1. The second worker to register measures its link to the first (ProbeLinks, the link
// probe over the workers' Exchange service), ListWorkers reports the figures, and `pipetrain plan
// --coordinator` plans with them; a coordinator run with --probe-links=false has the workers
// measure nothing and the plans use the default figures. Every process is started by the test and
// signalled by its PID only.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/sdk/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemons.h"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using testing::Example;
using ::testing::HasSubstr;
using testing::TempDir;

// The links ListWorkers reports, waiting (at most 30 s: each worker's probe takes well under a
// second on loopback) until there are `want` of them.
std::vector<v1::MeasuredLink> WaitForLinks(client::Client& client, size_t want) {
  std::vector<v1::MeasuredLink> links;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    links.clear();
    absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client.ListWorkers();
    if (!workers.ok()) break;
    for (const v1::WorkerInfo& w : *workers)
      links.insert(links.end(), w.links().begin(), w.links().end());
    if (links.size() >= want) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return links;
}

std::string PlanCommand(const testing::Daemons& daemons) {
  return absl::StrCat(PIPETRAIN_BINARY, " plan --coordinator ", daemons.address(), " --model ",
                      Example("mlp_digits.textproto"), " --data-dir ", PIPETRAIN_SOURCE_DIR,
                      "/data --batch 8 --top 1 2>&1");
}

TEST(MeasuredLinksTest, TheCoordinatorReportsTheLinkItsWorkersMeasured) {
  testing::Daemons daemons;
  ASSERT_EQ(daemons.Start(TempDir("link_probe_"), 2), "");
  const std::vector<v1::MeasuredLink> links = WaitForLinks(daemons.client(), 1);
  ASSERT_EQ(links.size(), 1u);
  const v1::MeasuredLink& l = links[0];
  EXPECT_EQ(l.error(), "");
  EXPECT_TRUE((l.from() == "w0" && l.to() == "w1") || (l.from() == "w1" && l.to() == "w0"))
      << l.from() << " -> " << l.to();
  for (const double x : {l.latency_seconds(), l.bytes_per_second(), l.cpu_seconds_per_message()}) {
    EXPECT_TRUE(std::isfinite(x) && x > 0) << x;
  }
  // `workers --json` prints it on the worker that measured it.
  const testing::CommandRun listed = testing::RunCommand(
      absl::StrCat(PIPETRAIN_BINARY, " workers --json --coordinator ", daemons.address(), " 2>&1"));
  ASSERT_EQ(listed.exit_code, 0) << listed.out;
  EXPECT_THAT(listed.out,
              ::testing::ContainsRegex(absl::StrCat(
                  "\"links\":\\[\\{\"bytes_per_second\":[0-9.e+]+,"
                  "\"cpu_seconds_per_message\":[0-9.e+-]+,\"from\":\"",
                  l.from(), "\",\"latency_seconds\":[0-9.e+-]+,\"to\":\"", l.to(), "\"\\}\\]")))
      << listed.out;
  EXPECT_THAT(listed.out, HasSubstr("\"links\":[]")) << "the first worker measured none";
  const testing::CommandRun plan = testing::RunCommand(PlanCommand(daemons));
  EXPECT_EQ(plan.exit_code, 0) << plan.out;
  EXPECT_THAT(plan.out, HasSubstr("(the worst of 1 measured link between the coordinator's "
                                  "workers; each measured pair's own latency and bandwidth in "
                                  "the plans)"));
  EXPECT_THAT(plan.out, HasSubstr("link measured: "));
  // Given figures override the measured ones.
  const testing::CommandRun given = testing::RunCommand(
      PlanCommand(daemons) + " --link-latency 1e-3 --link-bandwidth 1e8 --message-cpu 5e-5");
  EXPECT_EQ(given.exit_code, 0) << given.out;
  EXPECT_THAT(given.out, HasSubstr("link given: 1000 us, 100.0 MB/s, 50 us CPU per message"));
  EXPECT_EQ(daemons.Stop(), "");
}

TEST(MeasuredLinksTest, WithoutProbesThePlansUseTheDefaults) {
  testing::Daemons daemons;
  ASSERT_EQ(daemons.Start(TempDir("link_probe_off_"), 2, {"--probe-links=false"}), "");
  const testing::CommandRun plan = testing::RunCommand(PlanCommand(daemons));
  EXPECT_EQ(plan.exit_code, 0) << plan.out;
  EXPECT_THAT(plan.out, HasSubstr("link default: 100 us, 2.0 GB/s, 30 us CPU per message (no "
                                  "link between the coordinator's workers was measured"));
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = daemons.client().ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  for (const v1::WorkerInfo& w : *workers) EXPECT_EQ(w.links_size(), 0) << w.name();
  EXPECT_EQ(daemons.Stop(), "");
}

}  // namespace
}  // namespace pipetrain
