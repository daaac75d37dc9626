#include "client/sdk/job_watch.h"

#include <utility>

namespace pipetrain::client {

JobWatch::~JobWatch() {
  if (done_) return;
  context_->TryCancel();
  stream_->Finish().ok();
}

absl::StatusOr<std::optional<v1::JobEvent>> JobWatch::Next() {
  if (done_) {
    if (!final_.ok()) return final_;
    return std::nullopt;
  }
  v1::JobEvent event;
  if (stream_->Read(&event)) return std::optional<v1::JobEvent>(std::move(event));
  done_ = true;
  const grpc::Status status = stream_->Finish();
  final_ = status.ok() ? absl::OkStatus() : client_->CallError(status, "WatchJob");
  if (!final_.ok()) return final_;
  return std::nullopt;
}

void JobWatch::Cancel() { context_->TryCancel(); }

absl::StatusOr<std::unique_ptr<JobWatch>> Client::WatchJob(const std::string& job,
                                                           int64_t after_sequence) const {
  v1::WatchJobRequest request;
  request.set_job(job);
  request.set_after_sequence(after_sequence);
  auto context = std::make_unique<grpc::ClientContext>();
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> stream =
      stub_->WatchJob(context.get(), request);
  if (stream == nullptr) return absl::UnavailableError("cannot open a WatchJob stream");
  return std::unique_ptr<JobWatch>(new JobWatch(this, std::move(context), std::move(stream)));
}

}  // namespace pipetrain::client
