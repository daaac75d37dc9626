#include "server/worker/state_fetch.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/model/checkpoint.h"
#include "common/util/status_macros.h"
#include "common/wire/grpc_status.h"

namespace pipetrain::worker {
namespace {

// A file being received: its manifest entry and the bytes so far.
struct Incoming {
  model::CheckpointShard shard;
  std::string bytes;
};

}  // namespace

absl::StatusOr<std::map<std::string, math::Tensor>> FetchState(v1::Coordinator::Stub* stub,
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

}  // namespace pipetrain::worker
