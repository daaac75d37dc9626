#include "server/coordinator/state_reactors.h"

#include <utility>

#include "common/wire/grpc_status.h"
#include "pipetrain/v1/worker_control.pb.h"

namespace pipetrain::coordinator {

FetchReactor::FetchReactor(absl::StatusOr<std::vector<StateFile>> files, OpThread* strand)
    : strand_(strand) {
  if (!files.ok()) {
    Finish(wire::ToGrpcStatus(files.status()));
    return;
  }
  download_ = std::make_unique<ShardDownload>(*std::move(files));
  OnStrand([this] { Next(); });
}

void FetchReactor::OnStrand(std::function<void()> task) {
  if (!strand_->Post(std::move(task))) {
    Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down"));
  }
}

void FetchReactor::Next() {
  absl::StatusOr<bool> more = download_->Next(&chunk_);
  if (!more.ok()) {
    Finish(wire::ToGrpcStatus(more.status()));
  } else if (!*more) {
    Finish(grpc::Status::OK);
  } else {
    StartWrite(&chunk_);
  }
}

void FetchReactor::OnWriteDone(bool ok) {
  if (!ok) {
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the worker stopped reading"));
    return;
  }
  OnStrand([this] { Next(); });
}

void FetchReactor::OnDone() {
  // The download's file is closed on the strand, after any task still queued there.
  if (!strand_->Post([this] { delete this; })) delete this;
}

UploadReactor::UploadReactor(CoordinatorCore* core, v1::PutStateResponse* response,
                             OpThread* strand, ShardUpload::WriteHook before_write)
    : core_(core), response_(response), strand_(strand), before_write_(std::move(before_write)) {
  StartRead(&request_);
}

void UploadReactor::OnReadDone(bool ok) {
  if (!strand_->Post([this, ok] { HandleRead(ok); })) {
    Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down"));
  }
}

void UploadReactor::HandleRead(bool ok) {
  if (!ok) {  // the worker's WritesDone (or a broken stream: then nobody reads the status).
    if (upload_ != nullptr) {
      if (absl::Status s = upload_->Finish(); !s.ok()) return Fail(s);
      response_->set_files(upload_->files());
      response_->set_bytes(upload_->bytes());
    }
    Finish(grpc::Status::OK);
    return;
  }
  if (absl::Status s = Handle(); !s.ok()) return Fail(s);
  StartRead(&request_);
}

absl::Status UploadReactor::Handle() {
  if (upload_ == nullptr) {
    absl::StatusOr<UploadTarget> target = core_->AcceptUpload(request_);
    if (!target.ok()) return target.status();
    upload_ = std::make_unique<ShardUpload>(*std::move(target), before_write_);
  }
  if (!request_.has_chunk()) return absl::OkStatus();  // the identity message.
  return upload_->Write(request_.chunk());
}

void UploadReactor::Fail(const absl::Status& status) {
  upload_.reset();  // removes a partial file.
  Finish(wire::ToGrpcStatus(status));
}

void UploadReactor::OnDone() {
  // A partial file is removed on the strand, after any task still queued there.
  if (!strand_->Post([this] { delete this; })) delete this;
}

}  // namespace pipetrain::coordinator
