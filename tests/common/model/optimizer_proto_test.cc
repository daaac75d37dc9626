#include "common/model/optimizer_proto.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace pipetrain::model {
namespace {

using ::testing::HasSubstr;

TEST(OptimizerProtoTest, UnsetAdamWFieldsTakeTheDocumentedDefaults) {
  v1::OptimizerSpec spec;
  spec.mutable_adamw();
  absl::StatusOr<math::OptimizerConfig> c = OptimizerFromProto(spec);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kind, math::OptimizerKind::kAdamW);
  EXPECT_EQ(c->lr, 1e-3f);
  EXPECT_EQ(c->beta1, 0.9f);
  EXPECT_EQ(c->beta2, 0.999f);
  EXPECT_EQ(c->eps, 1e-8f);
  EXPECT_EQ(c->weight_decay, 0.0f);
}

TEST(OptimizerProtoTest, AdamWBeta1ZeroIsSettable) {
  v1::OptimizerSpec spec;
  spec.mutable_adamw()->set_beta1(0.0f);
  spec.mutable_adamw()->set_beta2(0.5f);
  absl::StatusOr<math::OptimizerConfig> c = OptimizerFromProto(spec);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->beta1, 0.0f);
  EXPECT_EQ(c->beta2, 0.5f);
}

TEST(OptimizerProtoTest, UnsetSgdLrIsTheCliDefault) {
  v1::OptimizerSpec spec;
  spec.mutable_sgd();
  absl::StatusOr<math::OptimizerConfig> c = OptimizerFromProto(spec);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<math::OptimizerConfig> cli = math::ParseOptimizerConfig("sgd");
  ASSERT_TRUE(cli.ok());
  EXPECT_EQ(c->lr, cli->lr);
  EXPECT_EQ(c->lr, 0.1f);
}

TEST(OptimizerProtoTest, ExplicitZeroLrOrEpsIsRejected) {
  v1::OptimizerSpec spec;
  spec.mutable_adamw()->set_lr(0.0f);
  absl::StatusOr<math::OptimizerConfig> c = OptimizerFromProto(spec);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("lr"));
  v1::OptimizerSpec eps;
  eps.mutable_adamw()->set_eps(0.0f);
  EXPECT_EQ(OptimizerFromProto(eps).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(OptimizerProtoTest, NoKindIsInvalidArgument) {
  EXPECT_EQ(OptimizerFromProto(v1::OptimizerSpec()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(OptimizerProtoTest, ToProtoRoundTripsEveryValidConfigIncludingZeroBeta1) {
  math::OptimizerConfig config;
  config.kind = math::OptimizerKind::kAdamW;
  config.lr = 3e-3f;
  config.beta1 = 0.0f;
  config.beta2 = 0.95f;
  config.eps = 1e-6f;
  config.weight_decay = 0.01f;
  config.clip_norm = 1.0f;
  absl::StatusOr<math::OptimizerConfig> back = OptimizerFromProto(OptimizerToProto(config));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(math::FormatOptimizerConfig(*back), math::FormatOptimizerConfig(config));
  EXPECT_EQ(back->beta1, 0.0f);
}

}  // namespace
}  // namespace pipetrain::model
