#include "server/coordinator/join_reactor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/net/transport_security.h"
#include "common/wire/grpc_status.h"
#include "pipetrain/v1/worker_control.pb.h"

namespace pipetrain::coordinator {

JoinReactor::JoinReactor(CoordinatorCore* core, std::optional<net::PeerCertificate> certificate)
    : core_(core), certificate_(std::move(certificate)) {
  StartRead(&event_);
}

void JoinReactor::Send(const v1::WorkerCommand& command) {
  absl::MutexLock lock(&write_mu_);
  if (closed_) return;
  queue_.push_back(command);
  if (!writing_) {
    writing_ = true;
    StartWrite(&queue_.front());
  }
}

void JoinReactor::Close(const absl::Status& status) {
  absl::MutexLock lock(&write_mu_);
  if (closed_) return;
  closed_ = true;
  finish_status_ = wire::ToGrpcStatus(status);
  if (writing_) {
    while (queue_.size() > 1) queue_.pop_back();
  } else {
    queue_.clear();
    Finish(finish_status_);
  }
}

absl::Status JoinReactor::CheckCertificate(const v1::RegisterWorker& r) const {
  if (!certificate_.has_value()) return absl::OkStatus();
  if (absl::Status s = WorkerRegistry::CheckRegistration(r); !s.ok()) return s;
  absl::Status s = net::CheckCertificateVouchesForWorker(*certificate_, r.name(), r.address());
  if (s.ok()) return s;
  const absl::Status refused = wire::Annotate(s, absl::StrCat("RegisterWorker '", r.name(), "'"));
  core_->Log(std::string(refused.message()));
  return refused;
}

void JoinReactor::OnReadDone(bool ok) {
  if (!ok) {  // the worker ended its side or the stream broke.
    Close(absl::OkStatus());
    return;
  }
  absl::Status status;
  if (name_.empty() && event_.has_register_()) status = CheckCertificate(event_.register_());
  if (status.ok()) status = core_->OnWorkerEvent(this, &name_, event_);
  if (!status.ok()) {
    Close(status);
    return;
  }
  StartRead(&event_);
}

void JoinReactor::OnWriteDone(bool ok) {
  absl::MutexLock lock(&write_mu_);
  queue_.pop_front();
  writing_ = false;
  if (!ok && !closed_) {
    closed_ = true;
    finish_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "write to worker failed");
    queue_.clear();
  }
  if (closed_) {
    queue_.clear();
    Finish(finish_status_);
    return;
  }
  if (!queue_.empty()) {
    writing_ = true;
    StartWrite(&queue_.front());
  }
}

void JoinReactor::OnDone() {
  core_->OnWorkerGone(this, name_);
  delete this;
}

}  // namespace pipetrain::coordinator
