// JobJournal: the coordinator's durable record of the jobs that have not ended (--state-dir), so
// that a coordinator restarted after a crash continues them (docs/recovery.md).
//
//   state-dir/
//     jobs/job-1a2b3c4d-7.pb    one pipetrain.journal.v1.JobRecord per job, binary protobuf
//
// A record is written when a job becomes ready, after each checkpoint and after each recovery
// (WriteFileAtomically: the file holds the old or the new record after a crash, never a mix), and
// removed when the job ends. Only tracked jobs are written: a job is tracked from its creation
// (Track) until Remove, so a write that races with the job's end never brings its record back.
//
// Thread-safe: every method may be called from any thread; file operations are serialised.
#ifndef PIPETRAIN_SERVER_COORDINATOR_JOB_JOURNAL_H_
#define PIPETRAIN_SERVER_COORDINATOR_JOB_JOURNAL_H_

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "pipetrain/journal/v1/journal.pb.h"

namespace pipetrain::coordinator {

class JobJournal {
 public:
  // What Load found: the readable records (in file name order) and, for every file that is not
  // one, its path and why (NOT_FOUND / DATA_LOSS / INVALID_ARGUMENT). Unreadable files are left
  // in place for an operator to look at; they are never loaded.
  struct Contents {
    std::vector<journal::v1::JobRecord> records;
    std::vector<std::pair<std::string, absl::Status>> problems;
  };

  // Opens the journal in `state_dir`, creating it and its jobs/ directory if missing. Errors name
  // the path (FAILED_PRECONDITION if it is not a directory, PERMISSION_DENIED, ...).
  static absl::StatusOr<std::unique_ptr<JobJournal>> Open(const std::string& state_dir);

  JobJournal(const JobJournal&) = delete;
  JobJournal& operator=(const JobJournal&) = delete;

  const std::string& directory() const { return jobs_dir_; }

  // Reads every record. A record is valid when its file is named "<job>.pb" after its own `job`
  // field, the id has the coordinator's form ("job-" 8 hex digits "-" a number) and it parses.
  // Loaded jobs are tracked. Errors: only a jobs/ directory that cannot be listed.
  absl::StatusOr<Contents> Load() ABSL_LOCKS_EXCLUDED(mu_);

  // Starts tracking job `id` (no I/O): its records may be written from now on.
  void Track(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);

  // Replaces the record of `record.job()` durably. OK without writing if the job is not tracked
  // (it ended, or was never created here). INVALID_ARGUMENT for a malformed id; I/O errors name
  // the file.
  absl::Status Write(const journal::v1::JobRecord& record) ABSL_LOCKS_EXCLUDED(mu_);

  // Stops tracking job `id` (no I/O): a later Write of it writes nothing.
  void Untrack(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);

  // Stops tracking job `id` and removes its record durably (OK if it has none).
  absl::Status Remove(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);

  // Whether `id` has the form of a coordinator job id (and so is a safe file name).
  static bool IsJobId(const std::string& id);

 private:
  explicit JobJournal(std::string jobs_dir) : jobs_dir_(std::move(jobs_dir)) {}
  std::string PathOf(const std::string& id) const;

  const std::string jobs_dir_;  // state_dir/jobs

  // Serialises the file operations and guards the tracked set.
  absl::Mutex mu_;
  std::set<std::string> tracked_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_JOB_JOURNAL_H_
