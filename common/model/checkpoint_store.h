// CheckpointStore: the checkpoints of one job under one root directory, one subdirectory per step
// ("step-000000000123"), each an ordinary checkpoint directory (LoadCheckpoint,
// `pipetrain reference --resume ROOT/step-000000000123`).
//
//   root/
//     step-000000000100/    manifest.json, layer-00000.safetensors, ...
//     step-000000000200/
//     step-000000000300.tmp-4242-9f86d081884c7d65/   a save in progress (or a crash's leftover)
//
// A save: Begin(step) returns a staging directory beside the step's directory; shard writers
// write into it (WriteCheckpointShards); Commit(step, manifest) writes the manifest, verifies the
// staged checkpoint and publishes it atomically (PublishCheckpoint), then applies retention. A
// crash at any point leaves every published checkpoint intact; the next Open removes the staging
// directories it left.
//
// Steps only grow: a save of a step below the newest complete checkpoint is refused (one store
// holds one run's history). Retention keeps the `keep` complete checkpoints with the highest steps.
// It runs only after a commit, whose checkpoint was verified and is the newest, so the newest
// complete checkpoint is never removed before a newer one is complete. Directories that are not
// complete checkpoints are never removed (List reports them).
//
// Thread-compatible: const methods may run concurrently with each other; Begin, Commit and Abort
// need external synchronisation. One store per root at a time across processes: Open removes
// every staging directory under the root, including another live store's.
#ifndef PIPETRAIN_COMMON_MODEL_CHECKPOINT_STORE_H_
#define PIPETRAIN_COMMON_MODEL_CHECKPOINT_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/checkpoint.h"

namespace pipetrain::model {

struct CheckpointStoreOptions {
  // How many complete checkpoints to keep (the highest steps); >= 1. Default 3.
  int keep = 3;
};

// A complete checkpoint of the store.
struct StoredCheckpoint {
  int64_t step = 0;
  std::string path;  // root/step-NNNNNNNNNNNN
};

// An entry of the root that is not a usable checkpoint, and why.
struct SkippedEntry {
  std::string path;
  absl::Status reason;
};

struct CheckpointListing {
  std::vector<StoredCheckpoint> complete;  // ascending step.
  std::vector<SkippedEntry> skipped;       // in name order; staging directories are not listed.
};

struct CommitResult {
  StoredCheckpoint checkpoint;   // the committed checkpoint.
  std::vector<int64_t> removed;  // steps removed by retention.
  // OK, or why retention could not remove an old checkpoint; the commit succeeded either way.
  absl::Status retention;
};

class CheckpointStore {
 public:
  // Opens the store at `root`, creating the directory (and parents) if missing, and removes the
  // staging directories of unfinished saves. INVALID_ARGUMENT if options.keep < 1; the errors of
  // io::EnsureDirectory and io::ListDirectory naming the path.
  static absl::StatusOr<std::unique_ptr<CheckpointStore>> Open(
      const std::string& root, const CheckpointStoreOptions& options);

  CheckpointStore(const CheckpointStore&) = delete;
  CheckpointStore& operator=(const CheckpointStore&) = delete;

  const std::string& root() const { return root_; }

  // The directory of `step`'s checkpoint: root/step-%012d.
  std::string PathFor(int64_t step) const;

  // Starts a save of `step`: returns a fresh staging directory for the shard writers.
  // INVALID_ARGUMENT if step is negative or >= 2^53; FAILED_PRECONDITION if a save of `step` is
  // already in progress in this store or a complete checkpoint of a higher step exists (saving
  // the newest step again replaces it); I/O errors naming the path.
  absl::StatusOr<std::string> Begin(int64_t step);

  // Finishes the save of `step` begun with Begin: PublishCheckpoint(staging, PathFor(step),
  // manifest) -- the manifest written, the checkpoint verified and published atomically -- then
  // retention. Errors: FAILED_PRECONDITION if no save of `step` is in progress; INVALID_ARGUMENT if
  // manifest.step != step; PublishCheckpoint's (the staging directory is then removed and the
  // save is over). Retention failures do not fail the commit: see CommitResult::retention.
  absl::StatusOr<CommitResult> Commit(int64_t step, const CheckpointManifest& manifest);

  // Abandons the save of `step`, removing its staging directory. FAILED_PRECONDITION if none is in
  // progress.
  absl::Status Abort(int64_t step);

  // The checkpoints under the root. An entry counts as complete when it is named step-N with
  // exactly 12 or more digits, its manifest reads (ReadCheckpointManifest) with step N, and every
  // shard file exists with the manifest's size; contents are not hashed here (LoadCheckpoint and
  // Latest do). Everything else except staging directories is in `skipped` with the reason.
  // Errors: io::ListDirectory's for the root.
  absl::StatusOr<CheckpointListing> List() const;

  // The complete checkpoint with the highest step that also passes VerifyCheckpoint (so it will
  // load). Newer entries that fail are skipped and, if `skipped` is not null, appended to it with
  // the reason. NOT_FOUND naming the root and each skipped entry's reason if there is none.
  absl::StatusOr<StoredCheckpoint> Latest(std::vector<SkippedEntry>* skipped = nullptr) const;

 private:
  CheckpointStore(std::string root, const CheckpointStoreOptions& options);

  // Removes complete checkpoints beyond the `keep` highest steps, never `committed`.
  absl::Status ApplyRetention(int64_t committed, std::vector<int64_t>* removed) const;

  // Constant after construction.
  const std::string root_;
  const CheckpointStoreOptions options_;

  std::map<int64_t, std::string> staging_;  // step -> staging directory of a save in progress.
};

}  // namespace pipetrain::model

#endif  // PIPETRAIN_COMMON_MODEL_CHECKPOINT_STORE_H_
