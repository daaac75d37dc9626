#include "common/model/checkpoint_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/io/confined_path.h"
#include "common/io/dir_util.h"
#include "common/io/file_util.h"
#include "common/util/status_macros.h"

namespace pipetrain::model {
namespace {

constexpr char kStepPrefix[] = "step-";

std::string StepName(int64_t step) { return absl::StrFormat("%s%012d", kStepPrefix, step); }

// The step of a directory named as StepName writes it, or -1.
int64_t ParseStepName(const std::string& name) {
  if (!absl::StartsWith(name, kStepPrefix)) return -1;
  int64_t step = 0;
  const std::string digits = name.substr(sizeof(kStepPrefix) - 1);
  if (digits.size() > 16 || !absl::SimpleAtoi(digits, &step) || step < 0 ||
      StepName(step) != name) {
    return -1;
  }
  return step;
}

// OK if `path` holds a checkpoint of `step` whose manifest reads and whose shard files all exist
// with the manifest's sizes (contents not hashed).
absl::Status CheckComplete(const std::string& path, int64_t step) {
  PT_ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadCheckpointManifest(path));
  if (manifest.step != step) {
    return absl::DataLossError(absl::StrCat(path, ": the manifest's step is ", manifest.step,
                                            ", not the directory's ", step));
  }
  for (const CheckpointShard& shard : manifest.shards) {
    const std::string file = io::JoinPath(path, shard.file);
    // Opened as a load would: a symbolic link may not lead out of the checkpoint.
    PT_ASSIGN_OR_RETURN(const int fd, io::OpenConfinedFile(path, shard.file));
    struct stat st;
    const int stat_result = ::fstat(fd, &st);
    const int stat_errno = errno;
    ::close(fd);
    if (stat_result != 0) {
      return absl::ErrnoToStatus(stat_errno, absl::StrCat("cannot stat '", file, "'"));
    }
    if (st.st_size != shard.bytes) {
      return absl::DataLossError(
          absl::StrCat(file, ": ", st.st_size, " bytes, but the manifest says ", shard.bytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace

CheckpointStore::CheckpointStore(std::string root, const CheckpointStoreOptions& options)
    : root_(std::move(root)), options_(options) {}

absl::StatusOr<std::unique_ptr<CheckpointStore>> CheckpointStore::Open(
    const std::string& root, const CheckpointStoreOptions& options) {
  PT_RETURN_IF_ERROR(io::CheckNoNulByte(root));
  if (options.keep < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint store '", root, "': keep = ", options.keep, " must be >= 1"));
  }
  PT_RETURN_IF_ERROR(io::EnsureDirectory(root));
  PT_ASSIGN_OR_RETURN(std::vector<std::string> entries, io::ListDirectory(root));
  for (const std::string& entry : entries) {
    if (ParseStepName(io::StagingTarget(entry)) >= 0) {
      PT_RETURN_IF_ERROR(io::RemoveTree(io::JoinPath(root, entry)));
    }
  }
  return std::unique_ptr<CheckpointStore>(new CheckpointStore(root, options));
}

std::string CheckpointStore::PathFor(int64_t step) const {
  return io::JoinPath(root_, StepName(step));
}

absl::StatusOr<std::string> CheckpointStore::Begin(int64_t step) {
  if (step < 0 || step >= kMaxManifestCount) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint store: step ", step, " is out of range [0, 2^53)"));
  }
  if (staging_.count(step) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint store '", root_, "': a save of step ", step,
                     " is already in progress in ", staging_[step]));
  }
  PT_ASSIGN_OR_RETURN(CheckpointListing listing, List());
  if (!listing.complete.empty() && listing.complete.back().step > step) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint store '", root_, "': cannot save step ", step, " after step ",
                     listing.complete.back().step,
                     " (one store holds one run's history; use a new root for a "
                     "run resumed from an older checkpoint)"));
  }
  PT_ASSIGN_OR_RETURN(std::string staging, BeginCheckpointStaging(PathFor(step)));
  staging_[step] = staging;
  return staging;
}

absl::StatusOr<CommitResult> CheckpointStore::Commit(int64_t step,
                                                     const CheckpointManifest& manifest) {
  auto it = staging_.find(step);
  if (it == staging_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint store '", root_, "': no save of step ", step, " in progress (call Begin)"));
  }
  if (manifest.step != step) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint store '", root_,
                                                   "': committing step ", step,
                                                   " with a manifest of step ", manifest.step));
  }
  const std::string staging = std::move(it->second);
  staging_.erase(it);
  CommitResult result;
  result.checkpoint = {step, PathFor(step)};
  PT_RETURN_IF_ERROR(PublishCheckpoint(staging, result.checkpoint.path, manifest));
  result.retention = ApplyRetention(step, &result.removed);
  return result;
}

absl::Status CheckpointStore::Abort(int64_t step) {
  auto it = staging_.find(step);
  if (it == staging_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint store '", root_, "': no save of step ", step, " in progress"));
  }
  const std::string staging = std::move(it->second);
  staging_.erase(it);
  return DiscardCheckpointStaging(staging);
}

absl::StatusOr<CheckpointListing> CheckpointStore::List() const {
  PT_ASSIGN_OR_RETURN(std::vector<std::string> entries, io::ListDirectory(root_));
  CheckpointListing listing;
  std::map<int64_t, std::string> complete;
  for (const std::string& entry : entries) {
    if (!io::StagingTarget(entry).empty()) continue;
    const std::string path = io::JoinPath(root_, entry);
    const int64_t step = ParseStepName(entry);
    if (step < 0) {
      listing.skipped.push_back(
          {path, absl::InvalidArgumentError(absl::StrCat("'", entry, "' is not a checkpoint name (",
                                                         StepName(0), " and up)"))});
      continue;
    }
    absl::Status status = CheckComplete(path, step);
    if (status.ok()) {
      complete[step] = path;
    } else {
      listing.skipped.push_back({path, std::move(status)});
    }
  }
  for (auto& [step, path] : complete) listing.complete.push_back({step, std::move(path)});
  return listing;
}

absl::StatusOr<StoredCheckpoint> CheckpointStore::Latest(std::vector<SkippedEntry>* skipped) const {
  PT_ASSIGN_OR_RETURN(CheckpointListing listing, List());
  std::vector<SkippedEntry> rejected = std::move(listing.skipped);
  for (auto it = listing.complete.rbegin(); it != listing.complete.rend(); ++it) {
    absl::Status status = VerifyCheckpoint(it->path).status();
    if (status.ok()) {
      if (skipped != nullptr) skipped->insert(skipped->end(), rejected.begin(), rejected.end());
      return *it;
    }
    rejected.push_back({it->path, std::move(status)});
  }
  std::string why;
  for (const SkippedEntry& e : rejected) absl::StrAppend(&why, "; ", e.reason.message());
  if (skipped != nullptr) skipped->insert(skipped->end(), rejected.begin(), rejected.end());
  return absl::NotFoundError(absl::StrCat("no complete checkpoint in '", root_, "'", why));
}

absl::Status CheckpointStore::ApplyRetention(int64_t committed,
                                             std::vector<int64_t>* removed) const {
  PT_ASSIGN_OR_RETURN(CheckpointListing listing, List());
  const size_t keep = static_cast<size_t>(options_.keep);
  if (listing.complete.size() <= keep) return absl::OkStatus();
  const size_t excess = listing.complete.size() - keep;
  for (size_t i = 0; i < excess; ++i) {
    const StoredCheckpoint& old = listing.complete[i];
    if (old.step == committed) continue;
    PT_RETURN_IF_ERROR(io::RemoveDirectoryAtomically(old.path));
    removed->push_back(old.step);
  }
  return absl::OkStatus();
}

}  // namespace pipetrain::model
