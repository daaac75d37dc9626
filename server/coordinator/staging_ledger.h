// StagingLedger: the checkpoint staging directories a coordinator may leave behind when it dies,
// so that the next coordinator on the same state directory removes exactly those
// (docs/checkpoints.md, "Staging directories").
//
//   state-dir/
//     staging/job-1a2b3c4d-7.pb   one pipetrain.journal.v1.StagingRecord per checkpoint in progress
//
// A job's checkpoint records (Begin) its process id and its directory DIR before it creates its
// staging directory, and drops the record (End) once the checkpoint is published or discarded.
// While the record exists, that process may have created, beside DIR:
//   - "DIR.tmp-<pid>-<16 hex>": the staging directory the workers upload into, which after the
//     publish holds the old contents being removed (io::PublishDirectory);
//   - "DIR.step-<N>.tmp-<pid>-<16 hex>": an earlier checkpoint kept beside DIR being removed by
//     retention (io::RemoveDirectoryAtomically).
// RemoveLeftovers, when a coordinator starts on the state directory, removes for every record
// exactly the directories of those two forms that carry the record's pid, and then the record. It
// never touches DIR itself, a kept checkpoint, another process's staging directory (another pid)
// or anything else beside DIR. A process id is unique among live processes, and the state
// directory's lock (StateDirLock) keeps every other coordinator off the ledger, so while a record
// exists only its process creates directories of those names.
//
// Thread-safe: every method may be called from any thread; file operations are serialised.
#ifndef PIPETRAIN_SERVER_COORDINATOR_STAGING_LEDGER_H_
#define PIPETRAIN_SERVER_COORDINATOR_STAGING_LEDGER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace pipetrain::coordinator {

class StagingLedger {
 public:
  // What RemoveLeftovers did: the staging directories it removed, and every record or directory
  // it could not handle with the reason (those records stay, for the next start).
  struct Cleanup {
    std::vector<std::string> removed;
    std::vector<std::pair<std::string, absl::Status>> problems;
  };

  // Opens the ledger in `state_dir`, creating its staging/ directory if missing. Errors name the
  // path. The caller holds the state directory's lock (StateDirLock).
  static absl::StatusOr<std::unique_ptr<StagingLedger>> Open(const std::string& state_dir);

  StagingLedger(const StagingLedger&) = delete;
  StagingLedger& operator=(const StagingLedger&) = delete;

  const std::string& directory() const { return dir_; }

  // Durably records that this process (getpid()) starts a checkpoint of `job` into `directory`,
  // replacing `job`'s earlier record. Call before the staging directory is created.
  // INVALID_ARGUMENT for a malformed job id or an empty directory; I/O errors name the file.
  absl::Status Begin(const std::string& job, const std::string& directory) ABSL_LOCKS_EXCLUDED(mu_);

  // Drops `job`'s record (OK if it has none): its checkpoint is over and its staging directory
  // published or removed.
  absl::Status End(const std::string& job) ABSL_LOCKS_EXCLUDED(mu_);

  // For every record a dead coordinator left: removes its staging directories (above), then the
  // record. Errors: only a staging/ directory that cannot be listed; everything else is reported
  // in Cleanup::problems.
  absl::StatusOr<Cleanup> RemoveLeftovers() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit StagingLedger(std::string dir) : dir_(std::move(dir)) {}
  std::string PathOf(const std::string& job) const;

  const std::string dir_;  // state_dir/staging

  // Serialises the file operations.
  absl::Mutex mu_;
};

// Whether `name` (one path component) is a staging directory that the process `pid` made for
// `base` or for one of its kept earlier checkpoints: "<base>.tmp-<pid>-<16 hex>" or
// "<base>.step-<12 to 18 digits>.tmp-<pid>-<16 hex>".
bool IsStagingOf(const std::string& name, const std::string& base, int64_t pid);

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_STAGING_LEDGER_H_
