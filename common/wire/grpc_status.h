// absl::Status <-> grpc::Status: the one place where the two status types are converted.
//
// Codes map one to one (both use the canonical google.rpc codes); the message is kept, absl status
// payloads are dropped. All functions are pure and thread-safe.
#ifndef PIPETRAIN_COMMON_WIRE_GRPC_STATUS_H_
#define PIPETRAIN_COMMON_WIRE_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pipetrain::wire {

// The gRPC status with the same code and message (OK for OK).
grpc::Status ToGrpcStatus(const absl::Status& status);

// The absl status with the same code and message (OK for OK). A code outside the canonical range
// becomes UNKNOWN.
absl::Status FromGrpcStatus(const grpc::Status& status);

// FromGrpcStatus(status) with `context` prepended to its message ("context: message"); OK stays OK.
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view context);

// `status` with `context` prepended to its message, same code; OK stays OK.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace pipetrain::wire

#endif  // PIPETRAIN_COMMON_WIRE_GRPC_STATUS_H_
