#include "server/coordinator/job_journal.h"

#include <cerrno>
#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/io/dir_util.h"
#include "common/io/file_util.h"
#include "common/io/scoped_fd.h"
#include "common/util/status_macros.h"

namespace pipetrain::coordinator {
namespace {

constexpr absl::string_view kSuffix = ".pb";
// A record is a job spec and a few paths: far below this.
constexpr int64_t kMaxRecordBytes = int64_t{16} << 20;

}  // namespace

bool JobJournal::IsJobId(const std::string& id) {
  absl::string_view rest = id;
  if (!absl::ConsumePrefix(&rest, "job-") || rest.size() < 10 || rest[8] != '-') return false;
  for (int i = 0; i < 8; ++i) {
    if (!absl::ascii_isxdigit(rest[i])) return false;
  }
  rest.remove_prefix(9);
  if (rest.empty() || rest.size() > 18) return false;
  for (char c : rest) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<JobJournal>> JobJournal::Open(const std::string& state_dir) {
  if (state_dir.empty()) return absl::InvalidArgumentError("--state-dir: empty path");
  const std::string jobs = io::JoinPath(state_dir, "jobs");
  PT_RETURN_IF_ERROR(io::EnsureDirectory(jobs));
  return std::unique_ptr<JobJournal>(new JobJournal(jobs));
}

std::string JobJournal::PathOf(const std::string& id) const {
  return io::JoinPath(jobs_dir_, absl::StrCat(id, kSuffix));
}

absl::StatusOr<JobJournal::Contents> JobJournal::Load() {
  absl::MutexLock lock(&mu_);
  PT_ASSIGN_OR_RETURN(std::vector<std::string> names, io::ListDirectory(jobs_dir_));
  Contents contents;
  for (const std::string& name : names) {
    const std::string path = io::JoinPath(jobs_dir_, name);
    absl::string_view stem = name;
    if (!absl::ConsumeSuffix(&stem, kSuffix)) {
      // Temporary files of an interrupted write and anything else: not records.
      continue;
    }
    if (!IsJobId(std::string(stem))) {
      contents.problems.emplace_back(
          path, absl::InvalidArgumentError("not named after a job id (job-<8 hex>-<n>.pb)"));
      continue;
    }
    absl::StatusOr<std::string> bytes = io::ReadFile(path, kMaxRecordBytes);
    if (!bytes.ok()) {
      contents.problems.emplace_back(path, bytes.status());
      continue;
    }
    journal::v1::JobRecord record;
    if (!record.ParseFromString(*bytes)) {
      contents.problems.emplace_back(path, absl::DataLossError("not a JobRecord (corrupt)"));
      continue;
    }
    if (record.job() != stem) {
      contents.problems.emplace_back(
          path, absl::DataLossError(absl::StrCat("the record is of job '", record.job(), "'")));
      continue;
    }
    tracked_.insert(record.job());
    contents.records.push_back(std::move(record));
  }
  return contents;
}

void JobJournal::Track(const std::string& id) {
  absl::MutexLock lock(&mu_);
  tracked_.insert(id);
}

absl::Status JobJournal::Write(const journal::v1::JobRecord& record) {
  if (!IsJobId(record.job())) {
    return absl::InvalidArgumentError(
        absl::StrCat("journal: '", record.job(), "' is not a job id"));
  }
  absl::MutexLock lock(&mu_);
  if (tracked_.count(record.job()) == 0) return absl::OkStatus();
  return io::WriteFileAtomically(PathOf(record.job()), record.SerializeAsString());
}

void JobJournal::Untrack(const std::string& id) {
  absl::MutexLock lock(&mu_);
  tracked_.erase(id);
}

absl::Status JobJournal::Remove(const std::string& id) {
  absl::MutexLock lock(&mu_);
  tracked_.erase(id);
  if (!IsJobId(id)) return absl::OkStatus();  // never written.
  const std::string path = PathOf(id);
  if (std::remove(path.c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return io::ErrnoError(errno, "journal: cannot remove", path);
  }
  return io::SyncDirectory(jobs_dir_);
}

}  // namespace pipetrain::coordinator
