// The file side of checkpoint transfers, without the transport: ShardUpload stores the files a
// worker uploads (PutState) in the staging directory of the checkpoint in progress; ShardDownload
// reads the files a worker fetches (FetchState). Both block on disk I/O: the gRPC shell runs them
// on its I/O threads (io_pool.h), never on a gRPC callback thread.
#ifndef PIPETRAIN_SERVER_COORDINATOR_SHARD_TRANSFER_H_
#define PIPETRAIN_SERVER_COORDINATOR_SHARD_TRANSFER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/io/digest.h"
#include "common/model/checkpoint.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/coordinator/coordinator_core.h"

namespace pipetrain::coordinator {

// Receives one worker's checkpoint files, chunk by chunk. Each file is written to "FILE.part",
// digested as it arrives, and once complete fsynced, checked against the size and SHA-256
// announced with it, renamed to its name and the directory fsynced. Only the files of `target`
// are accepted, each once. Not thread-safe (one stream's chunks, in order).
class ShardUpload {
 public:
  static constexpr int64_t kMaxFileBytes = int64_t{1} << 40;

  // Called before each write of a chunk with the file's path (a test's slow disk); may be null.
  using WriteHook = std::function<void(const std::string& part_path)>;

  ShardUpload(UploadTarget target, WriteHook before_write)
      : target_(std::move(target)), before_write_(std::move(before_write)) {}
  // Removes a partial file.
  ~ShardUpload();
  ShardUpload(const ShardUpload&) = delete;
  ShardUpload& operator=(const ShardUpload&) = delete;

  // Stores one chunk. PERMISSION_DENIED for a file not of this worker's layers (or sent twice),
  // INVALID_ARGUMENT for a first chunk without offset 0, the layers, a size in [0, 2^40] and a
  // SHA-256; DATA_LOSS for a chunk that does not continue the file or a digest mismatch;
  // UNAVAILABLE for a failed write, fsync or rename (naming the path).
  absl::Status Write(const v1::StateChunk& chunk);

  // OK once every file begun was completed; DATA_LOSS naming a file that ended early.
  absl::Status Finish() const;

  int64_t files() const { return files_; }
  int64_t bytes() const { return bytes_; }

 private:
  absl::Status Begin(const v1::StateChunk& chunk);
  absl::Status Complete();
  void Abandon();

  UploadTarget target_;  // its files: those not yet received.
  const WriteHook before_write_;
  model::CheckpointShard current_;  // the file being received.
  std::string part_;                // its ".part" path; empty when none is open.
  int fd_ = -1;
  int64_t offset_ = 0;
  std::optional<io::Sha256Stream> digest_;
  int64_t files_ = 0;
  int64_t bytes_ = 0;
};

// Reads checkpoint files as chunks of at most 1 MiB, the first chunk of a file carrying its
// manifest entry. Not thread-safe.
class ShardDownload {
 public:
  static constexpr int64_t kChunkBytes = int64_t{1} << 20;

  explicit ShardDownload(std::vector<StateFile> files) : files_(std::move(files)) {}
  ~ShardDownload();
  ShardDownload(const ShardDownload&) = delete;
  ShardDownload& operator=(const ShardDownload&) = delete;

  // Fills `chunk` with the next piece and returns true, or returns false after the last one.
  // io::OpenConfinedFile's errors if a file cannot be opened in its directory (PERMISSION_DENIED
  // for a link leading out), DATA_LOSS if it is shorter than its manifest says.
  absl::StatusOr<bool> Next(v1::StateChunk* chunk);

 private:
  const std::vector<StateFile> files_;
  size_t index_ = 0;
  int fd_ = -1;
  int64_t offset_ = 0;
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_SHARD_TRANSFER_H_
