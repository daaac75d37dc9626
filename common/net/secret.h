// NewSecret: fresh random secrets (OpenSSL's generator), e.g. a job's data-link secret per
// generation. No transport: usable by the coordinator's core.
#ifndef PIPETRAIN_COMMON_NET_SECRET_H_
#define PIPETRAIN_COMMON_NET_SECRET_H_

#include <string>

#include "absl/status/statusor.h"

namespace pipetrain::net {

// 32 random bytes as 64 lowercase hex digits. INTERNAL if OpenSSL's generator fails.
// Thread-safe.
absl::StatusOr<std::string> NewSecret();

}  // namespace pipetrain::net

#endif  // PIPETRAIN_COMMON_NET_SECRET_H_
