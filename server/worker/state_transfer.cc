#include "server/worker/state_transfer.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>

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

// Assembles the files of one FetchState stream chunk by chunk, and parses each once complete.
class StateReceiver {
 public:
  explicit StateReceiver(const StateRequest& request) : request_(request) {}

  // Takes the stream's next chunk: the start of a new file (the previous one is then complete)
  // or the continuation of the current one. Errors (FetchState's): the previous file's
  // (FinishFile), INVALID_ARGUMENT for a file outside this worker's chunks, DATA_LOSS for a chunk
  // that does not continue its file or overruns its announced size.
  absl::Status Add(const v1::StateChunk& chunk);
  // Once the stream ended OK: every tensor received, the last file checked (FinishFile).
  absl::StatusOr<std::map<std::string, math::Tensor>> Finish();

 private:
  // Verifies the complete file and moves its tensors into tensors_: ParseCheckpointShard's
  // errors (DATA_LOSS if it is short), INVALID_ARGUMENT for a tensor sent twice.
  absl::Status FinishFile();
  // Begins the file whose first chunk is `chunk`, if it lies within one of the request's layer
  // ranges and announces a sane size (INVALID_ARGUMENT otherwise).
  absl::Status StartFile(const v1::StateChunk& chunk);

  const StateRequest& request_;
  std::map<std::string, math::Tensor> tensors_;
  std::optional<Incoming> file_;
};

absl::Status StateReceiver::Add(const v1::StateChunk& chunk) {
  if (!file_.has_value() || chunk.file() != file_->shard.file) {
    if (file_.has_value()) PT_RETURN_IF_ERROR(FinishFile());
    PT_RETURN_IF_ERROR(StartFile(chunk));
  }
  if (chunk.offset() != static_cast<int64_t>(file_->bytes.size()) ||
      static_cast<int64_t>(file_->bytes.size() + chunk.data().size()) > file_->shard.bytes) {
    return absl::DataLossError(
        absl::StrCat("checkpoint file ", file_->shard.file, ": chunk at offset ", chunk.offset(),
                     " does not continue the ", file_->bytes.size(), " bytes received"));
  }
  file_->bytes.append(chunk.data());
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, math::Tensor>> StateReceiver::Finish() {
  if (file_.has_value()) PT_RETURN_IF_ERROR(FinishFile());
  return std::move(tensors_);
}

absl::Status StateReceiver::FinishFile() {
  const std::string where =
      absl::StrCat("checkpoint file ", file_->shard.file, " (from the coordinator)");
  PT_ASSIGN_OR_RETURN(
      io::SafetensorsFile parsed,
      model::ParseCheckpointShard(where, file_->shard, file_->bytes, request_.step));
  for (auto& [name, tensor] : parsed.tensors) {
    if (!tensors_.emplace(name, std::move(tensor)).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": tensor ", name, " sent twice"));
    }
  }
  file_.reset();
  return absl::OkStatus();
}

absl::Status StateReceiver::StartFile(const v1::StateChunk& chunk) {
  bool inside = false;
  for (const auto& [first, last] : request_.layer_ranges) {
    inside = inside || (chunk.first_layer() >= first && chunk.last_layer() <= last &&
                        chunk.first_layer() < chunk.last_layer());
  }
  if (!inside || chunk.bytes() < 0 || chunk.bytes() > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the coordinator sent checkpoint file ", chunk.file(), " of layers [",
                     chunk.first_layer(), ", ", chunk.last_layer(), ") (", chunk.bytes(),
                     " bytes), which is not within this worker's chunks"));
  }
  file_.emplace();
  file_->shard.file = chunk.file();
  file_->shard.first_layer = chunk.first_layer();
  file_->shard.last_layer = chunk.last_layer();
  file_->shard.sha256 = chunk.sha256();
  file_->shard.bytes = chunk.bytes();
  file_->bytes.reserve(static_cast<size_t>(chunk.bytes()));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::map<std::string, math::Tensor>> FetchState(v1::WorkerControl::Stub* stub,
                                                               const StateRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + request.timeout));
  v1::FetchStateRequest fetch;
  fetch.set_job(request.job);
  fetch.set_generation(request.generation);
  fetch.set_worker(request.worker);
  std::unique_ptr<grpc::ClientReader<v1::StateChunk>> reader = stub->FetchState(&context, fetch);
  StateReceiver receiver(request);
  v1::StateChunk chunk;
  absl::Status bad;
  while (bad.ok() && reader->Read(&chunk)) bad = receiver.Add(chunk);
  if (!bad.ok()) {
    context.TryCancel();
    (void)reader->Finish();  // the local error is the one to report.
    return bad;
  }
  const grpc::Status status = reader->Finish();
  if (!status.ok()) return wire::FromGrpcStatus(status, "FetchState");
  return receiver.Finish();
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
  request.set_generation(upload.generation);
  request.set_step(upload.step);
  request.set_worker(upload.worker);
  // The first message names the operation and carries no chunk; the identity is not repeated.
  bool open = writer->Write(request);
  request.clear_job();
  request.clear_generation();
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
