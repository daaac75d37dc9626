// OptimizerSpec (wire, model.proto) <-> math::OptimizerConfig (domain): the one place where the
// optimizer's protobuf form is converted. Used by the coordinator (JobSpec -> Assign) and the
// stage worker (Assign -> Stage).
#ifndef PIPETRAIN_COMMON_MODEL_OPTIMIZER_PROTO_H_
#define PIPETRAIN_COMMON_MODEL_OPTIMIZER_PROTO_H_

#include "absl/status/statusor.h"
#include "common/math/optimizer.h"
#include "pipetrain/v1/model.pb.h"

namespace pipetrain::model {

// The config `spec` describes, with the proto's documented defaults for unset optional fields
// (SGD lr 0.1; AdamW lr 1e-3, beta1 0.9, beta2 0.999, eps 1e-8; a field set to 0 is 0), then
// checked with math::ValidateOptimizerConfig.
// INVALID_ARGUMENT if no optimizer kind is set or a hyper-parameter is out of range (the message
// names it). Pure, thread-safe.
absl::StatusOr<math::OptimizerConfig> OptimizerFromProto(const v1::OptimizerSpec& spec);

// The spec of `config` with every field set (fields that do not apply to its kind are dropped).
// OptimizerFromProto of the result equals `config` for any valid config.
// Pure, thread-safe.
v1::OptimizerSpec OptimizerToProto(const math::OptimizerConfig& config);

}  // namespace pipetrain::model

#endif  // PIPETRAIN_COMMON_MODEL_OPTIMIZER_PROTO_H_
