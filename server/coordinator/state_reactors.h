// The coordinator's checkpoint transfer streams. Their disk I/O runs on a strand of the shell's
// IoPool, never on a gRPC callback thread: a reaction only hands the message over.
//  - FetchReactor (FetchState): streams a worker's checkpoint files (ShardDownload), one write in
//    flight. The worker verifies each file's size and SHA-256 end to end.
//  - UploadReactor (PutState): stores a worker's uploaded files in the staging directory of the
//    checkpoint in progress (ShardUpload), one read in flight.
// Both delete themselves, on their strand, after OnDone.
#ifndef PIPETRAIN_SERVER_COORDINATOR_STATE_REACTORS_H_
#define PIPETRAIN_SERVER_COORDINATOR_STATE_REACTORS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/coordinator/coordinator_core.h"
#include "server/coordinator/op_thread.h"
#include "server/coordinator/shard_transfer.h"

namespace pipetrain::coordinator {

class FetchReactor final : public grpc::ServerWriteReactor<v1::StateChunk> {
 public:
  // Finishes at once with the error of `files`, else streams them.
  FetchReactor(absl::StatusOr<std::vector<StateFile>> files, OpThread* strand);

  void OnWriteDone(bool ok) override;
  void OnDone() override;

 private:
  // Strand: reads the next chunk and writes it, or finishes after the last one.
  void Next();
  // Runs `task` on the strand (or finishes UNAVAILABLE if the pool is closing).
  void OnStrand(std::function<void()> task);

  OpThread* const strand_;
  std::unique_ptr<ShardDownload> download_;  // strand only.
  v1::StateChunk chunk_;  // the write in flight; filled on the strand before StartWrite.
};

class UploadReactor final : public grpc::ServerReadReactor<v1::PutStateRequest> {
 public:
  UploadReactor(CoordinatorCore* core, v1::PutStateResponse* response, OpThread* strand,
                ShardUpload::WriteHook before_write);

  void OnReadDone(bool ok) override;
  void OnDone() override;

 private:
  // Strand: handles the message read (or the end of the stream).
  void HandleRead(bool ok);
  absl::Status Handle();
  void Fail(const absl::Status& status);

  CoordinatorCore* const core_;
  v1::PutStateResponse* const response_;
  OpThread* const strand_;
  const ShardUpload::WriteHook before_write_;
  v1::PutStateRequest request_;          // the read in flight; the strand's once it completed.
  std::unique_ptr<ShardUpload> upload_;  // strand only; set by the first message.
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_STATE_REACTORS_H_
