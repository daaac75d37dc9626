#include "server/metrics/process_metrics.h"

#include <fcntl.h>
#include <prometheus/text_serializer.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics/metrics_registry.h"

namespace pipetrain::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Optional;

// A stat line as Linux writes it, with a command name holding spaces and parentheses:
// utime 150, stime 50, starttime 500 ticks, vsize 8192000 bytes, rss 10 pages.
constexpr char kStat[] =
    "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 150 50 0 0 20 0 3 0 500 8192000 10 "
    "18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";

TEST(ParseProcStatTest, FieldsAfterTheCommandName) {
  absl::StatusOr<ProcStat> s = ParseProcStat(kStat);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->utime_ticks, 150);
  EXPECT_EQ(s->stime_ticks, 50);
  EXPECT_EQ(s->start_ticks, 500);
  EXPECT_EQ(s->vsize_bytes, 8192000);
  EXPECT_EQ(s->rss_pages, 10);
}

TEST(ParseProcStatTest, ShortOrGarbledLinesNameTheField) {
  absl::StatusOr<ProcStat> s = ParseProcStat("1 (x) S 1 2 3");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("field 14 (utime) is missing"));
  s = ParseProcStat("1 (x) S 1 1 1 0 -1 0 0 0 0 0 oops 50 0 0 20 0 3 0 500 8192000 10");
  EXPECT_THAT(s.status().message(), HasSubstr("field 14 (utime) is not an integer: 'oops'"));
  s = ParseProcStat("no parenthesis");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParseBootTimeTest, BtimeLine) {
  const absl::StatusOr<int64_t> btime =
      ParseBootTime("cpu  1 2 3\nintr 5\nbtime 1700000000\nprocesses 9\n");
  ASSERT_TRUE(btime.ok()) << btime.status();
  EXPECT_EQ(*btime, 1700000000);
  EXPECT_EQ(ParseBootTime("cpu 1\n").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseBootTime("btime x\n").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParseMaxOpenFilesTest, SoftLimitOrNothing) {
  const std::string limits =
      "Limit                     Soft Limit           Hard Limit           Units     \n"
      "Max cpu time              unlimited            unlimited            seconds   \n"
      "Max open files            1024                 524288               files     \n";
  EXPECT_EQ(ParseMaxOpenFiles(limits), 1024);
  EXPECT_EQ(ParseMaxOpenFiles("Max open files            unlimited            unlimited   files\n"),
            std::nullopt);
  EXPECT_EQ(ParseMaxOpenFiles("Max cpu time  unlimited unlimited seconds\n"), std::nullopt);
}

class FakeProcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pipetrain_proc_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::filesystem::create_directories(dir_ + "/self/fd");
    for (const char* fd : {"0", "1", "2"}) std::ofstream(dir_ + "/self/fd/" + fd) << "";
    std::ofstream(dir_ + "/self/stat") << kStat;
    std::ofstream(dir_ + "/self/limits") << "Max open files            4096     8192     files\n";
    std::ofstream(dir_ + "/stat") << "cpu  1 2 3\nbtime 1700000000\n";
    source_.self_dir = dir_ + "/self";
    source_.stat_file = dir_ + "/stat";
    source_.ticks_per_second = 100;
    source_.page_size = 4096;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string dir_;
  ProcSource source_;
};

TEST_F(FakeProcTest, FiguresFromTheFiles) {
  absl::StatusOr<ProcessSample> s = ReadProcessSample(source_);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->cpu_seconds, 2.0);         // (150 + 50) / 100
  EXPECT_EQ(s->resident_bytes, 40960.0);  // 10 pages of 4096
  EXPECT_EQ(s->virtual_bytes, 8192000.0);
  EXPECT_EQ(s->open_fds, 3.0);
  EXPECT_THAT(s->max_fds, Optional(4096.0));
  EXPECT_EQ(s->start_time_seconds, 1700000005.0);  // btime + 500 / 100

  // As the exposition shows them, in the standard names and types.
  const std::string text = prometheus::TextSerializer().Serialize(ProcessFamilies(*s));
  EXPECT_THAT(text, HasSubstr("# TYPE process_cpu_seconds_total counter"));
  EXPECT_THAT(SampleValue(text, "process_cpu_seconds_total"), Optional(2.0));
  EXPECT_THAT(text, HasSubstr("# TYPE process_resident_memory_bytes gauge"));
  EXPECT_THAT(SampleValue(text, "process_resident_memory_bytes"), Optional(40960.0));
  EXPECT_THAT(SampleValue(text, "process_virtual_memory_bytes"), Optional(8192000.0));
  EXPECT_THAT(SampleValue(text, "process_open_fds"), Optional(3.0));
  EXPECT_THAT(SampleValue(text, "process_max_fds"), Optional(4096.0));
  EXPECT_THAT(SampleValue(text, "process_start_time_seconds"), Optional(1700000005.0));
}

TEST_F(FakeProcTest, MissingOrBadFilesAreNamedErrors) {
  std::filesystem::remove(dir_ + "/self/limits");
  absl::StatusOr<ProcessSample> s = ReadProcessSample(source_);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->max_fds, std::nullopt);  // and process_max_fds is left out:
  EXPECT_THAT(prometheus::TextSerializer().Serialize(ProcessFamilies(*s)),
              ::testing::Not(HasSubstr("process_max_fds")));

  std::ofstream(dir_ + "/stat") << "cpu 1\n";
  s = ReadProcessSample(source_);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr(dir_ + "/stat: stat: no btime line"));

  std::filesystem::remove(dir_ + "/self/stat");
  s = ReadProcessSample(source_);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.status().message(), HasSubstr(dir_ + "/self/stat"));
  // The collector leaves the families out rather than failing the scrape.
  EXPECT_TRUE(ProcessCollector(source_).Collect().empty());
}

// This process, read from the real /proc.
TEST(ProcessSampleTest, ThisProcess) {
  absl::StatusOr<ProcessSample> before = ReadProcessSample();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_GT(before->resident_bytes, 0);
  EXPECT_GE(before->virtual_bytes, before->resident_bytes);
  // Started at most an hour ago (and not in the future; 1 s for rounding to clock ticks).
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_LE(before->start_time_seconds, now + 1);
  EXPECT_GT(before->start_time_seconds, now - 3600);
  // The CPU time agrees with getrusage to a few clock ticks.
  rusage usage{};
  ASSERT_EQ(getrusage(RUSAGE_SELF, &usage), 0);
  const double rusage_seconds = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec * 1e-6 +
                                usage.ru_stime.tv_sec + usage.ru_stime.tv_usec * 1e-6;
  EXPECT_NEAR(before->cpu_seconds, rusage_seconds, 0.05);
  // One more open file is one more descriptor.
  const int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  absl::StatusOr<ProcessSample> after = ReadProcessSample();
  close(fd);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->open_fds, before->open_fds + 1);
  EXPECT_EQ(after->start_time_seconds, before->start_time_seconds);
}

TEST(ProcessSampleTest, EveryRegistryServesTheProcessMetrics) {
  MetricsRegistry r("stage_worker");
  const std::string text = r.TextExposition();
  for (const char* name :
       {"process_cpu_seconds_total", "process_resident_memory_bytes",
        "process_virtual_memory_bytes", "process_open_fds", "process_start_time_seconds"}) {
    EXPECT_TRUE(SampleValue(text, name).has_value()) << name << " in\n" << text;
  }
  EXPECT_THAT(
      SampleValue(
          text, "pipetrain_build_info",
          {{"daemon", "stage_worker"}, {"version", BuildVersion()}, {"commit", BuildCommit()}}),
      Optional(1.0));
}

}  // namespace
}  // namespace pipetrain::metrics
