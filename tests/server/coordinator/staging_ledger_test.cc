#include "server/coordinator/staging_ledger.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/io/dir_util.h"
#include "common/io/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipetrain/journal/v1/journal.pb.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

constexpr char kJob[] = "job-0123abcd-7";
constexpr char kHex[] = "0123456789abcdef";

class StagingLedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/pipetrain_staging_XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr);
    dir_ = templ;
    state_ = dir_ + "/state";
    ck_ = dir_ + "/root/ck";
    std::filesystem::create_directories(dir_ + "/root");
  }
  void TearDown() override { ASSERT_TRUE(io::RemoveTree(dir_).ok()); }

  std::unique_ptr<StagingLedger> Open() const {
    absl::StatusOr<std::unique_ptr<StagingLedger>> ledger = StagingLedger::Open(state_);
    EXPECT_TRUE(ledger.ok()) << ledger.status();
    return ledger.ok() ? *std::move(ledger) : nullptr;
  }

  // Creates directory `path` with a file in it.
  static std::string MakeDir(const std::string& path) {
    std::filesystem::create_directories(path);
    std::ofstream(path + "/layer-00000.safetensors") << "bytes";
    return path;
  }

  std::string dir_;
  std::string state_;
  std::string ck_;  // the checkpoint directory of the recorded checkpoint.
};

TEST(IsStagingOfTest, OnlyTheStagingNamesOfTheDirectoryAndItsKeptCheckpointsWithThePid) {
  EXPECT_TRUE(IsStagingOf(absl::StrCat("ck.tmp-42-", kHex), "ck", 42));
  EXPECT_TRUE(IsStagingOf(absl::StrCat("ck.step-000000000010.tmp-42-", kHex), "ck", 42));
  EXPECT_FALSE(IsStagingOf(absl::StrCat("ck.tmp-43-", kHex), "ck", 42));   // another process.
  EXPECT_FALSE(IsStagingOf(absl::StrCat("ck2.tmp-42-", kHex), "ck", 42));  // another directory.
  EXPECT_FALSE(IsStagingOf(absl::StrCat("ck.step-10.tmp-42-", kHex), "ck", 42));  // not kept.
  EXPECT_FALSE(IsStagingOf("ck.tmp-42-0123", "ck", 42));  // not a staging name.
  EXPECT_FALSE(IsStagingOf("ck", "ck", 42));
  EXPECT_FALSE(IsStagingOf("ck.step-000000000010", "ck", 42));
  EXPECT_FALSE(IsStagingOf(absl::StrCat("ck.tmp-42-", kHex, "x"), "ck", 42));
}

// A coordinator killed during a checkpoint left its record: the next one removes exactly the
// staging directories that process made for that checkpoint, then the record.
TEST_F(StagingLedgerTest, TheLeftoversOfADeadProcessAreRemovedAndNothingElse) {
  const int pid = getpid();  // the "dead" coordinator is this process before its restart.
  const std::string upload = MakeDir(absl::StrCat(ck_, ".tmp-", pid, "-", kHex));
  const std::string retention =
      MakeDir(absl::StrCat(ck_, ".step-000000000010.tmp-", pid, "-", kHex));
  const std::vector<std::string> kept = {
      MakeDir(ck_),                                             // the published checkpoint.
      MakeDir(ck_ + ".step-000000000020"),                      // a kept earlier one.
      MakeDir(absl::StrCat(ck_, ".tmp-", pid + 1, "-", kHex)),  // another process's staging.
      MakeDir(absl::StrCat(dir_, "/root/other.tmp-", pid, "-", kHex)),  // not recorded.
      MakeDir(ck_ + ".tmp-mine"),                                       // a user's.
  };
  ASSERT_TRUE(Open()->Begin(kJob, ck_).ok());  // and the process dies before End.
  absl::StatusOr<StagingLedger::Cleanup> cleanup = Open()->RemoveLeftovers();
  ASSERT_TRUE(cleanup.ok()) << cleanup.status();
  EXPECT_THAT(cleanup->removed, UnorderedElementsAre(upload, retention));
  EXPECT_TRUE(cleanup->problems.empty());
  EXPECT_FALSE(std::filesystem::exists(upload));
  EXPECT_FALSE(std::filesystem::exists(retention));
  for (const std::string& path : kept) EXPECT_TRUE(std::filesystem::exists(path)) << path;
  EXPECT_TRUE(std::filesystem::is_empty(state_ + "/staging"));  // the record is gone too.
  // Nothing left to do the next time.
  cleanup = Open()->RemoveLeftovers();
  ASSERT_TRUE(cleanup.ok());
  EXPECT_TRUE(cleanup->removed.empty());
}

// Without a record nothing is removed: a checkpoint that ended dropped its record.
TEST_F(StagingLedgerTest, AnEndedCheckpointLeavesNothingToRemove) {
  const std::string staging = MakeDir(absl::StrCat(ck_, ".tmp-", getpid(), "-", kHex));
  std::unique_ptr<StagingLedger> ledger = Open();
  ASSERT_TRUE(ledger->Begin(kJob, ck_).ok());
  ASSERT_TRUE(ledger->End(kJob).ok());
  ASSERT_TRUE(ledger->End(kJob).ok());  // none: OK.
  absl::StatusOr<StagingLedger::Cleanup> cleanup = Open()->RemoveLeftovers();
  ASSERT_TRUE(cleanup.ok());
  EXPECT_TRUE(cleanup->removed.empty());
  EXPECT_TRUE(std::filesystem::exists(staging));
}

// A record that does not parse, or is not its job's, is reported and kept; so is a checkpoint
// directory whose parent is gone (nothing to remove: the record goes).
TEST_F(StagingLedgerTest, CorruptRecordsAreReportedAndKept) {
  std::unique_ptr<StagingLedger> ledger = Open();
  ASSERT_TRUE(ledger->Begin("job-0123abcd-8", dir_ + "/gone/ck").ok());
  std::ofstream(state_ + "/staging/" + kJob + ".pb") << "not a record";
  journal::v1::StagingRecord other;
  other.set_job("job-0123abcd-1");
  other.set_pid(getpid());
  other.set_directory(ck_);
  ASSERT_TRUE(
      io::WriteFileAtomically(state_ + "/staging/job-0123abcd-2.pb", other.SerializeAsString())
          .ok());
  absl::StatusOr<StagingLedger::Cleanup> cleanup = ledger->RemoveLeftovers();
  ASSERT_TRUE(cleanup.ok()) << cleanup.status();
  ASSERT_EQ(cleanup->problems.size(), 2u);
  EXPECT_EQ(cleanup->problems[0].first, state_ + "/staging/job-0123abcd-2.pb");
  EXPECT_EQ(cleanup->problems[1].first, absl::StrCat(state_, "/staging/", kJob, ".pb"));
  for (const auto& [path, why] : cleanup->problems) {
    EXPECT_EQ(why.code(), absl::StatusCode::kDataLoss) << path;
    EXPECT_THAT(why.message(), HasSubstr("not a StagingRecord of its job"));
  }
  absl::StatusOr<std::vector<std::string>> left = io::ListDirectory(state_ + "/staging");
  ASSERT_TRUE(left.ok());
  EXPECT_THAT(*left, ElementsAre("job-0123abcd-2.pb", absl::StrCat(kJob, ".pb")));
}

TEST_F(StagingLedgerTest, BeginRefusesWhatItCouldNotName) {
  std::unique_ptr<StagingLedger> ledger = Open();
  EXPECT_EQ(ledger->Begin("../job", ck_).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger->Begin(kJob, "").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain::coordinator
