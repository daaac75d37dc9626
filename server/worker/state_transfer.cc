#include "server/worker/state_transfer.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/model/checkpoint.h"
#include "common/util/status_macros.h"
#include "common/wire/grpc_status.h"
#include "pipetrain/v1/worker_control.pb.h"

namespace pipetrain::worker {
namespace {

// A file being received: its manifest entry and the bytes so far.
struct Incoming {
  model::CheckpointShard shard;
  std::string bytes;
};

}  // namespace

absl::StatusOr<std::map<std::string, math::Tensor>> FetchState(v1::WorkerControl::Stub* stub,
                                                               const StateRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + request.timeout));
  v1::FetchStateRequest fetch;
  fetch.set_job(request.job);
  fetch.set_epoch(request.epoch);
  fetch.set_worker(request.worker);
  std::unique_ptr<grpc::ClientReader<v1::StateChunk>> reader = stub->FetchState(&context, fetch);

  std::map<std::string, math::Tensor> tensors;
  std::optional<Incoming> file;
  // Verifies the complete file and moves its tensors into `tensors`.
  auto finish_file = [&]() -> absl::Status {
    const std::string where =
        absl::StrCat("checkpoint file ", file->shard.file, " (from the coordinator)");
    PT_ASSIGN_OR_RETURN(io::SafetensorsFile parsed,
                        model::ParseCheckpointShard(where, file->shard, file->bytes, request.step));
    for (auto& [name, tensor] : parsed.tensors) {
      if (!tensors.emplace(name, std::move(tensor)).second) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": tensor ", name, " sent twice"));
      }
    }
    file.reset();
    return absl::OkStatus();
  };

  v1::StateChunk chunk;
  absl::Status bad;
  while (bad.ok() && reader->Read(&chunk)) {
    if (!file.has_value() || chunk.file() != file->shard.file) {
      if (file.has_value()) {
        bad = finish_file();  // DATA_LOSS if it is short.
        if (!bad.ok()) break;
      }
      bool inside = false;
      for (const auto& [first, last] : request.layer_ranges) {
        inside = inside || (chunk.first_layer() >= first && chunk.last_layer() <= last &&
                            chunk.first_layer() < chunk.last_layer());
      }
      if (!inside || chunk.bytes() < 0 || chunk.bytes() > (int64_t{1} << 40)) {
        bad = absl::InvalidArgumentError(
            absl::StrCat("the coordinator sent checkpoint file ", chunk.file(), " of layers [",
                         chunk.first_layer(), ", ", chunk.last_layer(), ") (", chunk.bytes(),
                         " bytes), which is not within this worker's chunks"));
        break;
      }
      file.emplace();
      file->shard.file = chunk.file();
      file->shard.first_layer = chunk.first_layer();
      file->shard.last_layer = chunk.last_layer();
      file->shard.sha256 = chunk.sha256();
      file->shard.bytes = chunk.bytes();
      file->bytes.reserve(static_cast<size_t>(chunk.bytes()));
    }
    if (chunk.offset() != static_cast<int64_t>(file->bytes.size()) ||
        static_cast<int64_t>(file->bytes.size() + chunk.data().size()) > file->shard.bytes) {
      bad = absl::DataLossError(
          absl::StrCat("checkpoint file ", file->shard.file, ": chunk at offset ", chunk.offset(),
                       " does not continue the ", file->bytes.size(), " bytes received"));
      break;
    }
    file->bytes.append(chunk.data());
  }
  if (!bad.ok()) {
    context.TryCancel();
    (void)reader->Finish();  // the local error is the one to report.
    return bad;
  }
  const grpc::Status status = reader->Finish();
  if (!status.ok()) return wire::FromGrpcStatus(status, "FetchState");
  if (file.has_value()) PT_RETURN_IF_ERROR(finish_file());
  return tensors;
}

absl::StatusOr<std::vector<model::CheckpointShard>> PutState(
    v1::WorkerControl::Stub* stub, grpc::ClientContext* context, const StateUpload& upload,
    const std::map<std::string, math::Tensor>& tensors) {
  constexpr size_t kChunkBytes = size_t{1} << 20;
  context->set_deadline(absl::ToChronoTime(absl::Now() + upload.timeout));
  v1::PutStateResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::PutStateRequest>> writer =
      stub->PutState(context, &response);
  std::vector<model::CheckpointShard> shards = upload.shards;
  v1::PutStateRequest request;
  request.set_job(upload.job);
  request.set_epoch(upload.epoch);
  request.set_step(upload.step);
  request.set_worker(upload.worker);
  // The first message names the operation and carries no chunk; the identity is not repeated.
  bool open = writer->Write(request);
  request.clear_job();
  request.clear_epoch();
  request.clear_step();
  request.clear_worker();
  absl::Status local;
  for (model::CheckpointShard& shard : shards) {
    if (!open) break;  // the coordinator ended the call: Finish has its status.
    absl::StatusOr<std::string> bytes =
        model::SerializeCheckpointShard(&shard, tensors, upload.step);
    if (!bytes.ok()) {
      local = bytes.status();
      break;
    }
    for (size_t offset = 0; open && (offset < bytes->size() || offset == 0);
         offset += kChunkBytes) {
      v1::StateChunk* chunk = request.mutable_chunk();
      chunk->Clear();
      chunk->set_file(shard.file);
      if (offset == 0) {
        chunk->set_first_layer(shard.first_layer);
        chunk->set_last_layer(shard.last_layer);
        chunk->set_sha256(shard.sha256);
        chunk->set_bytes(shard.bytes);
      }
      chunk->set_offset(static_cast<int64_t>(offset));
      chunk->set_data(bytes->substr(offset, kChunkBytes));
      open = writer->Write(request);
      if (bytes->empty()) break;
    }
  }
  if (!local.ok()) {
    context->TryCancel();
    (void)writer->Finish();
    return local;
  }
  if (open) writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) return wire::FromGrpcStatus(status, "PutState");
  return shards;
}

}  // namespace pipetrain::worker
