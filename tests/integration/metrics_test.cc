// A real Prometheus server (Debian's `prometheus`) on 127.0.0.1 scrapes a coordinator and two
// workers started with --metrics-listen while `pipetrain train` runs a short job; the series are
// read back through Prometheus's HTTP API, and `promtool check metrics` accepts each daemon's
// exposition. Skipped (with the reason) where prometheus/promtool/curl are not installed.
// About 10 s.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/daemons.h"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using testing::Example;
using testing::ReadFile;
using testing::RunCommand;
using testing::TempDir;

constexpr char kPrometheus[] = "/usr/bin/prometheus";
constexpr char kPromtool[] = "/usr/bin/promtool";
constexpr int kSteps = 12;

bool Executable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

// A TCP port on 127.0.0.1 that was free a moment ago (for Prometheus's own listener, which
// cannot report a kernel-chosen port).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

// The address after "serving /metrics on " in the log `path`, waiting up to 10 s for it.
std::string MetricsAddress(const std::string& path) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    for (absl::string_view line : absl::StrSplit(ReadFile(path), '\n')) {
      const size_t at = line.find("serving /metrics on ");
      if (at == absl::string_view::npos) continue;
      // HOST:PORT ends the text line, or the JSON line's "msg" string.
      absl::string_view rest = line.substr(at + 20);
      return std::string(rest.substr(0, rest.find_first_of("\" \t}")));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return "";
}

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* tool : {kPrometheus, kPromtool, "/usr/bin/curl"}) {
      if (!Executable(tool)) {
        GTEST_SKIP() << tool << " is not installed (apt-get install prometheus curl); the "
                     << "Prometheus scrape test needs it";
      }
    }
    dir_ = TempDir("pipetrain_metrics_");
    ASSERT_FALSE(dir_.empty());
    const std::string error =
        daemons_.Start(dir_, 2, {"--metrics-listen", "127.0.0.1:0"},
                       {"--metrics-listen", "127.0.0.1:0", "--log-format", "json"});
    ASSERT_EQ(error, "");
    targets_ = {MetricsAddress(dir_ + "/coordinator.log"), MetricsAddress(dir_ + "/worker-0.log"),
                MetricsAddress(dir_ + "/worker-1.log")};
    for (const std::string& t : targets_)
      ASSERT_FALSE(t.empty()) << ReadFile(dir_ + "/coordinator.log");
  }

  void TearDown() override {
    if (prometheus_ > 0) {
      kill(prometheus_, SIGTERM);
      waitpid(prometheus_, nullptr, 0);
    }
    EXPECT_EQ(daemons_.Stop(), "");
    if (!dir_.empty()) RunCommand("rm -rf '" + dir_ + "'");
  }

  // Starts Prometheus scraping every target each 500 ms; returns its HTTP address.
  std::string StartPrometheus() {
    const int port = FreePort();
    std::ofstream(dir_ + "/prometheus.yml")
        << "global:\n  scrape_interval: 500ms\n  scrape_timeout: 400ms\n"
        << "scrape_configs:\n  - job_name: pipetrain\n    static_configs:\n"
        << "      - targets: ['" << absl::StrJoin(targets_, "', '") << "']\n";
    prometheus_ = testing::Spawn({kPrometheus, "--config.file=" + dir_ + "/prometheus.yml",
                                  "--storage.tsdb.path=" + dir_ + "/tsdb",
                                  absl::StrCat("--web.listen-address=127.0.0.1:", port)},
                                 dir_ + "/prometheus.log");
    return absl::StrCat("127.0.0.1:", port);
  }

  // The result vector of the instant query `q` (empty if Prometheus does not answer yet).
  nlohmann::json Query(const std::string& prometheus, const std::string& q) {
    const testing::CommandRun r =
        RunCommand(absl::StrCat("curl -sf --max-time 5 'http://", prometheus,
                                "/api/v1/query' --data-urlencode 'query=", q, "'"));
    if (r.exit_code != 0) return nlohmann::json::array();
    const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    if (j.is_discarded() || j.value("status", "") != "success") return nlohmann::json::array();
    return j["data"]["result"];
  }

  // Polls `q` (at most 30 s) until its single result's value is `want`; returns the last value.
  double WaitForValue(const std::string& prometheus, const std::string& q, double want) {
    double last = -1;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      const nlohmann::json result = Query(prometheus, q);
      if (result.size() == 1) {
        last = std::stod(result[0]["value"][1].get<std::string>());
        if (last == want) return last;
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
    return last;
  }

  // Polls `q` (at most 30 s) until it has a result; returns the last result (empty on timeout).
  nlohmann::json WaitForResult(const std::string& prometheus, const std::string& q) {
    nlohmann::json result = nlohmann::json::array();
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      result = Query(prometheus, q);
      if (!result.empty()) break;
      absl::SleepFor(absl::Milliseconds(200));
    }
    return result;
  }

  std::string dir_;
  testing::Daemons daemons_;
  std::vector<std::string> targets_;
  pid_t prometheus_ = -1;
};

TEST_F(MetricsTest, PrometheusScrapesBothDaemonsDuringAJob) {
  const std::string prometheus = StartPrometheus();
  // Every target up before the job, so the scrapes see it run.
  EXPECT_EQ(WaitForValue(prometheus, "count(up == 1)", 3), 3) << ReadFile(dir_ + "/prometheus.log");
  const testing::CommandRun train = RunCommand(absl::StrCat(
      PIPETRAIN_BINARY, " train --coordinator ", daemons_.address(),
      " --stages 2 --schedule 1f1b --model ", Example("mlp_digits.textproto"),
      " --batch 32 --microbatches 4 --seed 3 --steps ", kSteps, " --json 2>", dir_, "/train.err"));
  ASSERT_EQ(train.exit_code, 0) << ReadFile(dir_ + "/train.err");
  std::string last_loss;
  for (absl::string_view line : absl::StrSplit(train.out, '\n', absl::SkipEmpty())) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("loss") && j.value("step", 0) == kSteps) {
      last_loss = j["loss"].dump();
    }
  }
  ASSERT_FALSE(last_loss.empty()) << train.out;

  // Coordinator: the job's steps, step-time histogram, loss (the client's last loss), bubbles.
  EXPECT_EQ(WaitForValue(prometheus, "sum(pipetrain_job_steps_total)", kSteps), kSteps);
  EXPECT_EQ(WaitForValue(prometheus, "sum(pipetrain_job_step_seconds_count)", kSteps), kSteps);
  const nlohmann::json loss = Query(prometheus, "pipetrain_job_loss");
  ASSERT_EQ(loss.size(), 1u);
  EXPECT_NEAR(std::stod(loss[0]["value"][1].get<std::string>()), std::stod(last_loss), 1e-6);
  EXPECT_EQ(Query(prometheus, "pipetrain_job_bubble_ratio").size(), 2u);
  EXPECT_EQ(WaitForValue(prometheus, "pipetrain_jobs{state=\"done\"}", 1), 1);
  EXPECT_EQ(WaitForValue(prometheus, "pipetrain_workers{state=\"idle\"}", 2), 2);
  EXPECT_EQ(WaitForValue(prometheus, "count(pipetrain_build_info)", 3), 3);
  // Samples as a counter: 32 rows a step.
  EXPECT_EQ(WaitForValue(prometheus, "sum(pipetrain_job_samples_total)", 32 * kSteps), 32 * kSteps);
  // Process metrics on all three daemons: CPU spent, memory held, descriptors open, and a start
  // time in the last hour.
  for (const char* q :
       {"count(process_cpu_seconds_total > 0)", "count(process_resident_memory_bytes > 1e6)",
        "count(process_open_fds > 3)", "count(process_open_fds < process_max_fds)",
        "count(time() - process_start_time_seconds < 3600)"}) {
    EXPECT_EQ(WaitForValue(prometheus, q, 3), 3) << q;
  }
  // Workers: both computed forwards and sent tensors to their neighbour; the coordinator fed them.
  EXPECT_EQ(
      WaitForValue(prometheus, "count(pipetrain_worker_busy_seconds_total{kind=\"F\"} > 0)", 2), 2);
  EXPECT_EQ(WaitForValue(prometheus,
                         "count(pipetrain_link_sent_tensors_total{peer=~\"stage/.*\"} > 0)", 2),
            2);
  EXPECT_EQ(WaitForValue(prometheus,
                         "count(pipetrain_link_received_bytes_total{peer=\"coordinator\"} > 0)", 2),
            2);
  EXPECT_EQ(WaitForValue(prometheus, "count(pipetrain_worker_stashed_activation_bytes > 0)", 2), 2);

  // promtool accepts every exposition as it is served.
  for (const std::string& target : targets_) {
    const testing::CommandRun check = RunCommand(absl::StrCat(
        "curl -sf --max-time 5 http://", target, "/metrics | ", kPromtool, " check metrics 2>&1"));
    EXPECT_EQ(check.exit_code, 0) << target << ": " << check.out;
  }
  // Every query of the Grafana dashboard answers with data (its variables filled in). Its rates
  // need two samples of the job's series in their window, and a 12-step job may end within one
  // scrape interval: wait until three scrapes saw it.
  EXPECT_FALSE(
      WaitForResult(prometheus, "count_over_time(pipetrain_job_steps_total[1m]) >= 3").empty());
  std::ifstream dashboard_file(std::string(PIPETRAIN_SOURCE_DIR) +
                               "/deploy/grafana/pipetrain.json");
  const nlohmann::json dashboard = nlohmann::json::parse(dashboard_file, nullptr, false);
  ASSERT_FALSE(dashboard.is_discarded());
  int queries = 0;
  for (const nlohmann::json& panel : dashboard["panels"]) {
    for (const nlohmann::json& target : panel["targets"]) {
      std::string expr = target["expr"].get<std::string>();
      expr = absl::StrReplaceAll(
          expr, {{"$job_id", ".*"}, {"$__rate_interval", "5s"}, {"$__range", "1m"}});
      EXPECT_FALSE(Query(prometheus, expr).empty())
          << panel["title"].get<std::string>() << ": " << expr;
      ++queries;
    }
  }
  EXPECT_GE(queries, 10);
  // The workers log JSON lines (--log-format json), each an object with a level.
  for (absl::string_view line :
       absl::StrSplit(ReadFile(dir_ + "/worker-0.log"), '\n', absl::SkipEmpty())) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << line;
    EXPECT_TRUE(j.contains("level") && j.contains("msg") && j.contains("time")) << line;
  }
}

}  // namespace
}  // namespace pipetrain
