#include "server/coordinator/job_journal.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/io/dir_util.h"
#include "common/io/file_util.h"
#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

class JobJournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/pipetrain_journal_XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr);
    dir_ = templ;
  }
  void TearDown() override { ASSERT_TRUE(io::RemoveTree(dir_).ok()); }

  static journal::v1::JobRecord Record(const std::string& id, int64_t restore_step) {
    journal::v1::JobRecord r;
    r.set_job(id);
    r.mutable_spec()->set_stages(3);
    r.mutable_spec()->set_schedule("1f1b");
    r.set_generation(4);
    r.set_restore_dir(absl::StrCat("/ckpt/", id));
    r.set_restore_step(restore_step);
    r.set_created_unix_ms(1234);
    return r;
  }

  std::string dir_;
};

TEST(JobIdTest, OnlyTheCoordinatorsFormIsAJobId) {
  EXPECT_TRUE(JobJournal::IsJobId("job-0a1b2c3d-1"));
  EXPECT_TRUE(JobJournal::IsJobId("job-ABCDEF01-123456"));
  for (const char* bad :
       {"", "job-", "job-0a1b2c3d-", "job-0a1b2c3-1", "job-0a1b2c3g-1", "job-0a1b2c3d-1x",
        "../job-0a1b2c3d-1", "job-0a1b2c3d-1/..", "job-0a1b2c3d-1234567890123456789"}) {
    EXPECT_FALSE(JobJournal::IsJobId(bad)) << bad;
  }
}

TEST_F(JobJournalTest, TrackedRecordsSurviveAReopenAndRemovedOnesDoNot) {
  {
    absl::StatusOr<std::unique_ptr<JobJournal>> journal = JobJournal::Open(dir_ + "/state");
    ASSERT_TRUE(journal.ok()) << journal.status();
    (*journal)->Track("job-00000001-1");
    (*journal)->Track("job-00000001-2");
    ASSERT_TRUE((*journal)->Write(Record("job-00000001-1", 10)).ok());
    ASSERT_TRUE((*journal)->Write(Record("job-00000001-2", 20)).ok());
    ASSERT_TRUE((*journal)->Write(Record("job-00000001-2", 30)).ok());  // replaces.
    ASSERT_TRUE((*journal)->Remove("job-00000001-1").ok());
    // Ended: a late write does not bring the record back; an untracked job is not written.
    ASSERT_TRUE((*journal)->Write(Record("job-00000001-1", 40)).ok());
    ASSERT_TRUE((*journal)->Write(Record("job-00000001-3", 50)).ok());
  }
  absl::StatusOr<std::unique_ptr<JobJournal>> journal = JobJournal::Open(dir_ + "/state");
  ASSERT_TRUE(journal.ok());
  absl::StatusOr<JobJournal::Contents> contents = (*journal)->Load();
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_TRUE(contents->problems.empty());
  ASSERT_EQ(contents->records.size(), 1u);
  EXPECT_EQ(contents->records[0].SerializeAsString(),
            Record("job-00000001-2", 30).SerializeAsString());
  // Loaded records are tracked: they can be written and removed.
  ASSERT_TRUE((*journal)->Write(Record("job-00000001-2", 60)).ok());
  contents = (*journal)->Load();
  ASSERT_TRUE(contents.ok());
  ASSERT_EQ(contents->records.size(), 1u);
  EXPECT_EQ(contents->records[0].restore_step(), 60);
}

// An ended job is untracked at once (no I/O, under the coordinator's lock): its record stays on
// disk until Remove, and a write racing with the end never replaces it.
TEST_F(JobJournalTest, AnUntrackedJobIsNotWrittenAndItsRecordStaysUntilRemoved) {
  absl::StatusOr<std::unique_ptr<JobJournal>> journal = JobJournal::Open(dir_ + "/state");
  ASSERT_TRUE(journal.ok()) << journal.status();
  (*journal)->Track("job-00000003-1");
  ASSERT_TRUE((*journal)->Write(Record("job-00000003-1", 10)).ok());
  (*journal)->Untrack("job-00000003-1");
  ASSERT_TRUE((*journal)->Write(Record("job-00000003-1", 20)).ok());
  absl::StatusOr<JobJournal::Contents> contents = (*journal)->Load();
  ASSERT_TRUE(contents.ok()) << contents.status();
  ASSERT_EQ(contents->records.size(), 1u);
  EXPECT_EQ(contents->records[0].restore_step(), 10);
  ASSERT_TRUE((*journal)->Remove("job-00000003-1").ok());
  contents = (*journal)->Load();
  ASSERT_TRUE(contents.ok());
  EXPECT_TRUE(contents->records.empty());
}

TEST_F(JobJournalTest, DamagedOrMisnamedFilesAreReportedAndNotLoaded) {
  absl::StatusOr<std::unique_ptr<JobJournal>> journal = JobJournal::Open(dir_);
  ASSERT_TRUE(journal.ok());
  const std::string jobs = (*journal)->directory();
  (*journal)->Track("job-00000002-1");
  ASSERT_TRUE((*journal)->Write(Record("job-00000002-1", 5)).ok());
  // Another job's record under this name, garbage, a bad name, and a temporary file.
  ASSERT_TRUE(io::WriteFileAtomically(jobs + "/job-00000002-7.pb",
                                      Record("job-00000002-8", 1).SerializeAsString())
                  .ok());
  ASSERT_TRUE(io::WriteFileAtomically(jobs + "/job-00000002-9.pb", "\xff\xff\xff garbage").ok());
  ASSERT_TRUE(io::WriteFileAtomically(jobs + "/evil.pb", "").ok());
  ASSERT_TRUE(io::WriteFileAtomically(jobs + "/job-00000002-1.pb.tmp-1", "").ok());
  absl::StatusOr<JobJournal::Contents> contents = (*journal)->Load();
  ASSERT_TRUE(contents.ok()) << contents.status();
  ASSERT_EQ(contents->records.size(), 1u);
  EXPECT_EQ(contents->records[0].job(), "job-00000002-1");
  ASSERT_EQ(contents->problems.size(), 3u);
  EXPECT_EQ(contents->problems[0].first, jobs + "/evil.pb");
  EXPECT_TRUE(absl::IsInvalidArgument(contents->problems[0].second));
  EXPECT_EQ(contents->problems[1].first, jobs + "/job-00000002-7.pb");
  EXPECT_TRUE(absl::IsDataLoss(contents->problems[1].second));
  EXPECT_EQ(contents->problems[2].first, jobs + "/job-00000002-9.pb");
  EXPECT_TRUE(absl::IsDataLoss(contents->problems[2].second));
}

TEST_F(JobJournalTest, BadStateDirectoriesAndIdsAreRefused) {
  EXPECT_TRUE(absl::IsInvalidArgument(JobJournal::Open("").status()));
  ASSERT_TRUE(io::WriteFileAtomically(dir_ + "/file", "x").ok());
  EXPECT_FALSE(JobJournal::Open(dir_ + "/file").ok());
  absl::StatusOr<std::unique_ptr<JobJournal>> journal = JobJournal::Open(dir_);
  ASSERT_TRUE(journal.ok());
  (*journal)->Track("../escape");
  journal::v1::JobRecord r;
  r.set_job("../escape");
  EXPECT_TRUE(absl::IsInvalidArgument((*journal)->Write(r)));
  EXPECT_TRUE((*journal)->Remove("../escape").ok());
}

}  // namespace
}  // namespace pipetrain::coordinator
