#include "common/wire/grpc_status.h"

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace pipetrain::wire {
namespace {

TEST(GrpcStatusTest, OkMapsToOk) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK, "ctx").ok());
}

TEST(GrpcStatusTest, EveryCanonicalCodeRoundTrips) {
  for (int code = 1; code <= 16; ++code) {
    const absl::Status a(static_cast<absl::StatusCode>(code), "what and where");
    const grpc::Status g = ToGrpcStatus(a);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    EXPECT_EQ(g.error_message(), "what and where");
    EXPECT_EQ(FromGrpcStatus(g), a);
  }
}

TEST(GrpcStatusTest, UnknownCodesBecomeUnknown) {
  // 20 is no gRPC code but lies in grpc::StatusCode's range of values ([-32, 31]: its
  // enumerators span -1..16), so the cast is defined behaviour.
  const grpc::Status odd(static_cast<grpc::StatusCode>(20), "odd");
  EXPECT_EQ(FromGrpcStatus(odd).code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(99), "x")).error_code(),
            grpc::StatusCode::UNKNOWN);
}

TEST(GrpcStatusTest, ContextIsPrepended) {
  const absl::Status s =
      FromGrpcStatus(grpc::Status(grpc::StatusCode::ABORTED, "stale"), "link to stage 2");
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(s.message(), "link to stage 2: stale");
  EXPECT_EQ(Annotate(absl::UnavailableError("gone"), "peer").message(), "peer: gone");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "peer").ok());
}

}  // namespace
}  // namespace pipetrain::wire
