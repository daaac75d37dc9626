#include "common/wire/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/util/annotate.h"

namespace pipetrain::wire {
namespace {

constexpr int kMaxCanonicalCode = 16;  // UNAUTHENTICATED.

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  int code = static_cast<int>(status.code());
  if (code < 0 || code > kMaxCanonicalCode) code = static_cast<int>(grpc::StatusCode::UNKNOWN);
  return grpc::Status(static_cast<grpc::StatusCode>(code), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  int code = static_cast<int>(status.error_code());
  if (code <= 0 || code > kMaxCanonicalCode) code = static_cast<int>(absl::StatusCode::kUnknown);
  return absl::Status(static_cast<absl::StatusCode>(code), status.error_message());
}

absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view context) {
  return Annotate(FromGrpcStatus(status), context);
}

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  return util::Annotate(status, context);
}

}  // namespace pipetrain::wire
