#include "common/model/checkpoint_store.h"

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/io/dir_util.h"
#include "common/io/file_util.h"
#include "common/model/reference_trainer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/model/test_models.h"

namespace pipetrain::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
namespace fs = std::filesystem;

class CheckpointStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = (fs::path(::testing::TempDir()) / "checkpoint_store_test" /
             ::testing::UnitTest::GetInstance()->current_test_info()->name())
                .string();
    fs::remove_all(root_);
    model_ = testing::BuildOrDie(testing::kMlpSpec);
  }

  std::unique_ptr<CheckpointStore> OpenStore(int keep) {
    CheckpointStoreOptions options;
    options.keep = keep;
    absl::StatusOr<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(root_, options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  // The state after `steps` reference training steps.
  std::map<std::string, math::Tensor> State(int steps) const {
    TrainerOptions o;
    o.microbatches = 2;
    o.seed = 7;
    auto t = ReferenceTrainer::Create(model_.get(), o);
    EXPECT_TRUE(t.ok());
    for (int s = 0; s < steps; ++s) {
      EXPECT_TRUE((*t)->Step(testing::MakeBatch(*model_, 4, s)).ok());
    }
    return (*t)->ExportState();
  }

  CheckpointManifest Manifest(int64_t step) const {
    CheckpointManifest m;
    m.step = step;
    m.model_spec = model_->spec();
    m.optimizer = "adamw:lr=0.001";
    m.seed = 7;
    m.data = "synthetic";
    m.batch_size = 4;
    m.microbatches = 2;
    return m;
  }

  // Begin, the two "stages" write their shards into the staging directory, Commit.
  absl::StatusOr<CommitResult> Save(CheckpointStore& store, int64_t step,
                                    const std::map<std::string, math::Tensor>& state) const {
    absl::StatusOr<std::string> staging = store.Begin(step);
    if (!staging.ok()) return staging.status();
    CheckpointManifest m = Manifest(step);
    for (auto [first, last] : {std::pair<int64_t, int64_t>{0, 3}, {3, 6}}) {
      auto shards = WriteCheckpointShards(*staging, LayerShards(*model_, first, last), state, step);
      if (!shards.ok()) return shards.status();
      m.shards.insert(m.shards.end(), shards->begin(), shards->end());
    }
    return store.Commit(step, m);
  }

  std::vector<std::string> Entries() const {
    absl::StatusOr<std::vector<std::string>> names = io::ListDirectory(root_);
    EXPECT_TRUE(names.ok()) << names.status();
    return names.ok() ? *names : std::vector<std::string>{};
  }

  static std::vector<int64_t> Steps(const CheckpointListing& listing) {
    std::vector<int64_t> out;
    for (const StoredCheckpoint& c : listing.complete) out.push_back(c.step);
    return out;
  }

  std::string root_;
  std::unique_ptr<Model> model_;
};

TEST_F(CheckpointStoreTest, CommittedCheckpointsAreOrdinaryCheckpointDirectories) {
  std::unique_ptr<CheckpointStore> store = OpenStore(3);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->PathFor(123), root_ + "/step-000000000123");
  const auto state = State(2);
  absl::StatusOr<CommitResult> r = Save(*store, 123, state);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->checkpoint.step, 123);
  EXPECT_EQ(r->checkpoint.path, root_ + "/step-000000000123");
  EXPECT_TRUE(r->retention.ok());
  EXPECT_THAT(r->removed, IsEmpty());
  EXPECT_THAT(Entries(), ElementsAre("step-000000000123"));

  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(r->checkpoint.path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->manifest.step, 123);
  EXPECT_EQ(loaded->tensors.size(), state.size());
  EXPECT_EQ(loaded->tensors.at("layers.3.weight").data, state.at("layers.3.weight").data);

  absl::StatusOr<StoredCheckpoint> latest = store->Latest();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step, 123);
  EXPECT_EQ(latest->path, r->checkpoint.path);
}

TEST_F(CheckpointStoreTest, RetentionKeepsTheNewestK) {
  std::unique_ptr<CheckpointStore> store = OpenStore(2);
  ASSERT_NE(store, nullptr);
  const auto state = State(1);
  for (int64_t step : {10, 20}) {
    absl::StatusOr<CommitResult> r = Save(*store, step, state);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_THAT(r->removed, IsEmpty());
  }
  absl::StatusOr<CommitResult> r = Save(*store, 30, state);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->retention.ok()) << r->retention;
  EXPECT_THAT(r->removed, ElementsAre(10));
  r = Save(*store, 40, state);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->removed, ElementsAre(20));
  EXPECT_THAT(Entries(), ElementsAre("step-000000000030", "step-000000000040"));
  absl::StatusOr<CheckpointListing> listing = store->List();
  ASSERT_TRUE(listing.ok());
  EXPECT_THAT(Steps(*listing), ElementsAre(30, 40));
  EXPECT_THAT(listing->skipped, IsEmpty());

  // Steps only grow: a run resumed from an older checkpoint belongs in a new root.
  absl::StatusOr<std::string> older = store->Begin(39);
  EXPECT_EQ(older.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(older.status().message(), HasSubstr("cannot save step 39 after step 40"));
  EXPECT_THAT(Entries(), ElementsAre("step-000000000030", "step-000000000040"));
}

// keep = 1: the only checkpoint survives every failed save and goes only once a newer one is
// complete.
TEST_F(CheckpointStoreTest, NewestCompleteCheckpointOutlivesFailedSaves) {
  std::unique_ptr<CheckpointStore> store = OpenStore(1);
  ASSERT_NE(store, nullptr);
  const auto state = State(1);
  ASSERT_TRUE(Save(*store, 1, state).ok());

  // A save whose shards were written at another step fails verification.
  absl::StatusOr<std::string> staging = store->Begin(2);
  ASSERT_TRUE(staging.ok());
  auto shards = WriteCheckpointShards(*staging, LayerShards(*model_, 0, 6), state, 1);
  ASSERT_TRUE(shards.ok());
  CheckpointManifest m = Manifest(2);
  m.shards = *shards;
  absl::StatusOr<CommitResult> r = store->Commit(2, m);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("written at step 1 but the manifest's step is 2"));
  EXPECT_THAT(Entries(), ElementsAre("step-000000000001"));

  // A save abandoned by its writers.
  staging = store->Begin(2);
  ASSERT_TRUE(staging.ok());
  ASSERT_TRUE(store->Abort(2).ok());
  EXPECT_FALSE(fs::exists(*staging));
  EXPECT_THAT(Entries(), ElementsAre("step-000000000001"));

  absl::StatusOr<StoredCheckpoint> latest = store->Latest();
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->step, 1);
  r = Save(*store, 2, state);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->removed, ElementsAre(1));
  EXPECT_THAT(Entries(), ElementsAre("step-000000000002"));
}

TEST_F(CheckpointStoreTest, LatestSkipsCorruptAndIncompleteCheckpointsAndSaysWhy) {
  std::unique_ptr<CheckpointStore> store = OpenStore(5);
  ASSERT_NE(store, nullptr);
  const auto state = State(1);
  ASSERT_TRUE(Save(*store, 1, state).ok());
  ASSERT_TRUE(Save(*store, 2, state).ok());
  // Step 2: one flipped byte. Step 3: no manifest. Junk beside them.
  const std::string file = store->PathFor(2) + "/layer-00005.safetensors";
  absl::StatusOr<std::string> bytes = io::ReadFile(file);
  ASSERT_TRUE(bytes.ok());
  (*bytes)[bytes->size() - 3] ^= 0x10;
  ASSERT_TRUE(io::WriteFileAtomically(file, *bytes).ok());
  ASSERT_TRUE(io::EnsureDirectory(store->PathFor(3)).ok());
  ASSERT_TRUE(io::WriteFileAtomically(root_ + "/README", "x").ok());

  // List does not hash: step 2 still looks complete there.
  absl::StatusOr<CheckpointListing> listing = store->List();
  ASSERT_TRUE(listing.ok());
  EXPECT_THAT(Steps(*listing), ElementsAre(1, 2));
  ASSERT_EQ(listing->skipped.size(), 2u);
  EXPECT_EQ(listing->skipped[0].path, root_ + "/README");
  EXPECT_EQ(listing->skipped[0].reason.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(listing->skipped[1].path, store->PathFor(3));
  EXPECT_EQ(listing->skipped[1].reason.code(), absl::StatusCode::kNotFound);

  std::vector<SkippedEntry> skipped;
  absl::StatusOr<StoredCheckpoint> latest = store->Latest(&skipped);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step, 1);
  ASSERT_EQ(skipped.size(), 3u);
  EXPECT_EQ(skipped[2].path, store->PathFor(2));
  EXPECT_EQ(skipped[2].reason.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(skipped[2].reason.message(), HasSubstr(file + ": SHA-256"));

  // Nothing usable: NOT_FOUND naming the root and the reasons.
  ASSERT_TRUE(io::RemoveTree(store->PathFor(1)).ok());
  latest = store->Latest();
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(latest.status().message(), HasSubstr("no complete checkpoint in '" + root_ + "'"));
  EXPECT_THAT(latest.status().message(), HasSubstr(file + ": SHA-256"));
}

// A crash mid-save leaves a staging directory; the published checkpoints are intact and the
// next Open removes it (and only staging directories of checkpoints).
TEST_F(CheckpointStoreTest, OpenRemovesStagingDirectoriesOfACrash) {
  const auto state = State(1);
  std::string staging;
  {
    std::unique_ptr<CheckpointStore> store = OpenStore(3);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(Save(*store, 7, state).ok());
    absl::StatusOr<std::string> s = store->Begin(8);
    ASSERT_TRUE(s.ok());
    staging = *s;
    ASSERT_TRUE(WriteCheckpointShards(staging, LayerShards(*model_, 0, 6), state, 8).ok());
    // "Crash": the store goes away without Commit or Abort.
  }
  EXPECT_EQ(io::StagingTarget(fs::path(staging).filename().string()), "step-000000000008");
  ASSERT_TRUE(io::EnsureDirectory(root_ + "/notes.tmp-1-0123456789abcdef").ok());
  EXPECT_THAT(Entries(), ElementsAre("notes.tmp-1-0123456789abcdef", "step-000000000007",
                                     fs::path(staging).filename().string()));
  {
    std::unique_ptr<CheckpointStore> store = OpenStore(3);
    ASSERT_NE(store, nullptr);
    EXPECT_THAT(Entries(), ElementsAre("notes.tmp-1-0123456789abcdef", "step-000000000007"));
    absl::StatusOr<StoredCheckpoint> latest = store->Latest();
    ASSERT_TRUE(latest.ok());
    EXPECT_EQ(latest->step, 7);
    // The step can be saved again.
    absl::StatusOr<CommitResult> r = Save(*store, 8, state);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(store->Latest()->step, 8);
  }
}

// Committing a step that exists replaces it atomically.
TEST_F(CheckpointStoreTest, RecommittingAStepReplacesIt) {
  std::unique_ptr<CheckpointStore> store = OpenStore(2);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(Save(*store, 4, State(1)).ok());
  const auto second = State(3);
  ASSERT_TRUE(Save(*store, 4, second).ok());
  EXPECT_THAT(Entries(), ElementsAre("step-000000000004"));
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(store->PathFor(4));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->tensors.at("layers.0.weight").data, second.at("layers.0.weight").data);
}

TEST_F(CheckpointStoreTest, MisuseIsReported) {
  CheckpointStoreOptions options;
  options.keep = 0;
  EXPECT_EQ(CheckpointStore::Open(root_, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::unique_ptr<CheckpointStore> store = OpenStore(1);
  ASSERT_NE(store, nullptr);

  absl::StatusOr<StoredCheckpoint> latest = store->Latest();
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(latest.status().message(), HasSubstr(root_));

  EXPECT_EQ(store->Commit(1, Manifest(1)).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->Abort(1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->Begin(-1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Begin(int64_t{1} << 53).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(store->Begin(1).ok());
  EXPECT_EQ(store->Begin(1).status().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<CommitResult> r = store->Commit(1, Manifest(2));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("committing step 1 with a manifest of step 2"));
  ASSERT_TRUE(store->Abort(1).ok());
  EXPECT_THAT(Entries(), IsEmpty());

  ASSERT_TRUE(io::WriteFileAtomically(root_ + "/f", "x").ok());
  EXPECT_EQ(CheckpointStore::Open(root_ + "/f", {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CheckpointStoreTest, RootWithANulByteIsInvalidArgument) {
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store =
      CheckpointStore::Open(root_ + std::string(1, '\0') + "x", CheckpointStoreOptions());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr("path contains a NUL byte"));
  EXPECT_FALSE(fs::exists(root_));
}

}  // namespace
}  // namespace pipetrain::model
