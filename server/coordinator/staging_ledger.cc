#include "server/coordinator/staging_ledger.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/io/dir_util.h"
#include "common/io/file_util.h"
#include "common/io/scoped_fd.h"
#include "common/util/status_macros.h"
#include "pipetrain/journal/v1/journal.pb.h"
#include "server/coordinator/job_journal.h"

namespace pipetrain::coordinator {
namespace {

constexpr absl::string_view kLedgerSuffix = ".pb";
// A record is a job id and a path: far below this.
constexpr int64_t kMaxLedgerRecordBytes = int64_t{1} << 20;

// `path` without trailing slashes, split into its parent and its last component.
std::pair<std::string, std::string> SplitPath(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

// Whether `target` is `base` or one of its kept earlier checkpoints ("<base>.step-<digits>").
bool IsCheckpointOf(absl::string_view target, absl::string_view base) {
  if (target == base) return true;
  if (!absl::ConsumePrefix(&target, base) || !absl::ConsumePrefix(&target, ".step-")) return false;
  return target.size() >= 12 && target.size() <= 18 &&
         std::all_of(target.begin(), target.end(), [](char c) { return absl::ascii_isdigit(c); });
}

// Removes the staging directories `record`'s process left beside its checkpoint directory
// (appending each to `removed`); OK if there is nothing to remove.
absl::Status RemoveStagingOf(const journal::v1::StagingRecord& record,
                             std::vector<std::string>* removed) {
  const auto [parent, base] = SplitPath(record.directory());
  absl::StatusOr<std::vector<std::string>> names = io::ListDirectory(parent);
  if (absl::IsNotFound(names.status())) return absl::OkStatus();  // nothing was staged there.
  if (!names.ok()) return names.status();
  bool any = false;
  for (const std::string& name : *names) {
    if (!IsStagingOf(name, base, record.pid())) continue;
    const std::string path = io::JoinPath(parent, name);
    PT_RETURN_IF_ERROR(io::RemoveTree(path));
    removed->push_back(path);
    any = true;
  }
  return any ? io::SyncDirectory(parent) : absl::OkStatus();
}

}  // namespace

bool IsStagingOf(const std::string& name, const std::string& base, int64_t pid) {
  const std::string target = io::StagingTarget(name);
  if (target.empty() || !IsCheckpointOf(target, base)) return false;
  // StagingTarget checked the form "<target>.tmp-<digits>-<16 hex>".
  absl::string_view rest = absl::string_view(name).substr(target.size() + 5);
  int64_t named = -1;
  return absl::SimpleAtoi(rest.substr(0, rest.find('-')), &named) && named == pid;
}

absl::StatusOr<std::unique_ptr<StagingLedger>> StagingLedger::Open(const std::string& state_dir) {
  if (state_dir.empty()) return absl::InvalidArgumentError("state directory: empty path");
  const std::string dir = io::JoinPath(state_dir, "staging");
  PT_RETURN_IF_ERROR(io::EnsureDirectory(dir));
  return std::unique_ptr<StagingLedger>(new StagingLedger(dir));
}

std::string StagingLedger::PathOf(const std::string& job) const {
  return io::JoinPath(dir_, absl::StrCat(job, kLedgerSuffix));
}

absl::Status StagingLedger::Begin(const std::string& job, const std::string& directory) {
  if (!JobJournal::IsJobId(job)) {
    return absl::InvalidArgumentError(absl::StrCat("staging ledger: '", job, "' is not a job id"));
  }
  if (directory.empty()) return absl::InvalidArgumentError("staging ledger: empty directory");
  journal::v1::StagingRecord record;
  record.set_job(job);
  record.set_pid(::getpid());
  record.set_directory(directory);
  absl::MutexLock lock(&mu_);
  return io::WriteFileAtomically(PathOf(job), record.SerializeAsString());
}

absl::Status StagingLedger::End(const std::string& job) {
  if (!JobJournal::IsJobId(job)) return absl::OkStatus();  // never recorded.
  absl::MutexLock lock(&mu_);
  const std::string path = PathOf(job);
  if (std::remove(path.c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return io::ErrnoError(errno, "staging ledger: cannot remove", path);
  }
  return absl::OkStatus();
}

absl::StatusOr<StagingLedger::Cleanup> StagingLedger::RemoveLeftovers() {
  absl::MutexLock lock(&mu_);
  PT_ASSIGN_OR_RETURN(std::vector<std::string> names, io::ListDirectory(dir_));
  Cleanup cleanup;
  for (const std::string& name : names) {
    absl::string_view stem = name;
    // Temporary files of an interrupted write and anything else: not records.
    if (!absl::ConsumeSuffix(&stem, kLedgerSuffix)) continue;
    const std::string path = io::JoinPath(dir_, name);
    absl::StatusOr<std::string> bytes = io::ReadFile(path, kMaxLedgerRecordBytes);
    journal::v1::StagingRecord record;
    absl::Status done = bytes.status();
    if (done.ok() && (!record.ParseFromString(*bytes) || record.job() != stem ||
                      record.directory().empty() || record.pid() <= 0)) {
      done = absl::DataLossError("not a StagingRecord of its job (corrupt)");
    }
    if (done.ok()) done = RemoveStagingOf(record, &cleanup.removed);
    if (done.ok() && std::remove(path.c_str()) != 0) {
      done = io::ErrnoError(errno, "cannot remove", path);
    }
    if (!done.ok()) cleanup.problems.emplace_back(path, done);
  }
  if (!names.empty()) PT_RETURN_IF_ERROR(io::SyncDirectory(dir_));
  return cleanup;
}

}  // namespace pipetrain::coordinator
