#include "common/model/checkpoint.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "common/io/file_util.h"
#include "common/model/reference_trainer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/model/test_models.h"

namespace pipetrain::model {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
  }
  std::string Dir(const std::string& sub) const { return (dir_ / sub).string(); }
  fs::path dir_;
};

CheckpointManifest ManifestFor(const Model& model, int64_t step) {
  CheckpointManifest m;
  m.step = step;
  m.model_spec = model.spec();
  m.optimizer = "adamw:lr=0.01";
  m.seed = 7;
  m.data = "synthetic";
  m.batch_size = 8;
  m.microbatches = 2;
  m.data_cursor = {3, 4};
  m.shards = LayerShards(model, 0, model.num_layers());
  return m;
}

TrainerOptions Opts() {
  TrainerOptions o;
  o.microbatches = 2;
  o.seed = 7;
  o.optimizer.lr = 1e-2f;
  return o;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST_F(CheckpointTest, RoundTripIsBitwiseAndResumeEqualsUninterruptedTraining) {
  auto model = testing::BuildOrDie(testing::kGptSpec);
  // Uninterrupted: 6 steps.
  auto straight = ReferenceTrainer::Create(model.get(), Opts());
  ASSERT_TRUE(straight.ok());
  for (int s = 0; s < 6; ++s) ASSERT_TRUE((*straight)->Step(testing::MakeBatch(*model, 4, s)).ok());

  // Interrupted: 3 steps, checkpoint, a fresh trainer loads it, 3 more steps.
  auto first = ReferenceTrainer::Create(model.get(), Opts());
  ASSERT_TRUE(first.ok());
  for (int s = 0; s < 3; ++s) ASSERT_TRUE((*first)->Step(testing::MakeBatch(*model, 4, s)).ok());
  ASSERT_TRUE(SaveCheckpoint(Dir("a"), ManifestFor(*model, 3), (*first)->ExportState()).ok());

  auto loaded = LoadCheckpoint(Dir("a"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->manifest.step, 3);
  EXPECT_EQ(loaded->manifest.data_cursor.epoch, 3);
  EXPECT_EQ(loaded->manifest.data_cursor.batch, 4);
  EXPECT_EQ(loaded->manifest.model_spec.SerializeAsString(), model->spec().SerializeAsString());
  auto second = ReferenceTrainer::Create(model.get(), Opts());
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE((*second)->ImportState(loaded->tensors, loaded->manifest.step).ok());
  for (int s = 3; s < 6; ++s) ASSERT_TRUE((*second)->Step(testing::MakeBatch(*model, 4, s)).ok());

  // Same bytes on disk for both end states.
  ASSERT_TRUE(SaveCheckpoint(Dir("b"), ManifestFor(*model, 6), (*straight)->ExportState()).ok());
  ASSERT_TRUE(SaveCheckpoint(Dir("c"), ManifestFor(*model, 6), (*second)->ExportState()).ok());
  const std::vector<CheckpointShard> shards = LayerShards(*model, 0, model->num_layers());
  ASSERT_EQ(shards.size(), 5u);  // embedding, two blocks, layer norm, linear
  for (const CheckpointShard& s : shards) {
    const std::string b = ReadAll(Dir("b") + "/" + s.file);
    EXPECT_GT(b.size(), 100u);
    EXPECT_EQ(b, ReadAll(Dir("c") + "/" + s.file)) << s.file;
  }
  EXPECT_EQ(ReadAll(Dir("b") + "/manifest.json"), ReadAll(Dir("c") + "/manifest.json"));
}

// Stages write the files of their own layers and the coordinator the manifest: the files are
// byte-identical to a single process's, and load back whole.
TEST_F(CheckpointTest, StagesWriteTheSameFilesAsOneProcess) {
  auto model = testing::BuildOrDie(testing::kMlpSpec);
  const int64_t n = model->num_layers();
  auto s0 = Stage::Create(model.get(), 0, 2, 7, Opts().optimizer);
  auto s1 = Stage::Create(model.get(), 2, n, 7, Opts().optimizer);
  ASSERT_TRUE(s0.ok() && s1.ok());
  ASSERT_TRUE(
      WriteCheckpointShards(Dir("s"), LayerShards(*model, 0, 2), s0->ExportState(), 0).ok());
  ASSERT_TRUE(
      WriteCheckpointShards(Dir("s"), LayerShards(*model, 2, n), s1->ExportState(), 0).ok());
  CheckpointManifest m = ManifestFor(*model, 0);
  ASSERT_TRUE(WriteCheckpointManifest(Dir("s"), m).ok());
  auto one = Stage::Create(model.get(), 0, n, 7, Opts().optimizer);
  ASSERT_TRUE(one.ok());
  ASSERT_TRUE(SaveCheckpoint(Dir("one"), m, one->ExportState()).ok());
  for (const CheckpointShard& s : m.shards) {
    EXPECT_EQ(ReadAll(Dir("s") + "/" + s.file), ReadAll(Dir("one") + "/" + s.file)) << s.file;
  }
  auto loaded = LoadCheckpoint(Dir("s"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto whole = ReferenceTrainer::Create(model.get(), Opts());
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(loaded->tensors.size(), (*whole)->ExportState().size());
  EXPECT_TRUE((*whole)->ImportState(loaded->tensors, 0).ok());
}

TEST_F(CheckpointTest, ErrorsNameTheProblem) {
  auto model = testing::BuildOrDie(testing::kMlpSpec);
  EXPECT_EQ(LoadCheckpoint(Dir("missing")).status().code(), absl::StatusCode::kNotFound);

  ASSERT_TRUE(io::EnsureDirectory(Dir("bad")).ok());
  ASSERT_TRUE(io::WriteFileAtomically(Dir("bad") + "/manifest.json", "{not json").ok());
  EXPECT_EQ(LoadCheckpoint(Dir("bad")).status().code(), absl::StatusCode::kDataLoss);
  ASSERT_TRUE(io::WriteFileAtomically(Dir("bad") + "/manifest.json",
                                      R"({"format": "pipetrain.checkpoint.v1", "step": "x"})")
                  .ok());
  EXPECT_THAT(LoadCheckpoint(Dir("bad")).status().message(), HasSubstr("'step'"));

  CheckpointManifest m = ManifestFor(*model, 1);
  m.shards[0].file = "../escape.safetensors";
  EXPECT_THAT(SaveCheckpoint(Dir("esc"), m, {}).message(), HasSubstr("not a plain file name"));
  // A shard whose tensors are not in the state is named.
  m = ManifestFor(*model, 1);
  EXPECT_THAT(SaveCheckpoint(Dir("empty"), m, {}).message(),
              HasSubstr("no tensors for shard layer-00000"));

  // A tensor missing from the checkpoint is named when importing.
  auto t = ReferenceTrainer::Create(model.get(), Opts());
  ASSERT_TRUE(t.ok());
  auto state = (*t)->ExportState();
  state.erase("layers.3.bias");
  auto s = (*t)->ImportState(state, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("layers.3.bias"));
  state = (*t)->ExportState();
  state["layers.0.weight"].shape = {8, 7};
  EXPECT_THAT((*t)->ImportState(state, 1).message(), HasSubstr("layers.0.weight has shape [8,7]"));
}

}  // namespace
}  // namespace pipetrain::model
