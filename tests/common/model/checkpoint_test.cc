#include "common/model/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/io/digest.h"
#include "common/io/dir_util.h"
#include "common/io/file_util.h"
#include "common/io/safetensors.h"
#include "common/model/reference_trainer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/model/test_models.h"

namespace pipetrain::model {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using json = nlohmann::json;
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

// Stages write the files of their own layers into one staging directory and the coordinator
// publishes it with their digests: the files are byte-identical to a single process's, and load
// back whole.
TEST_F(CheckpointTest, StagesWriteTheSameFilesAsOneProcess) {
  auto model = testing::BuildOrDie(testing::kMlpSpec);
  const int64_t n = model->num_layers();
  auto s0 = Stage::Create(model.get(), 0, 2, 7, Opts().optimizer);
  auto s1 = Stage::Create(model.get(), 2, n, 7, Opts().optimizer);
  ASSERT_TRUE(s0.ok() && s1.ok());
  absl::StatusOr<std::string> staging = BeginCheckpointStaging(Dir("s"));
  ASSERT_TRUE(staging.ok()) << staging.status();
  auto d0 = WriteCheckpointShards(*staging, LayerShards(*model, 0, 2), s0->ExportState(), 0);
  auto d1 = WriteCheckpointShards(*staging, LayerShards(*model, 2, n), s1->ExportState(), 0);
  ASSERT_TRUE(d0.ok()) << d0.status();
  ASSERT_TRUE(d1.ok()) << d1.status();
  CheckpointManifest m = ManifestFor(*model, 0);
  m.shards = *d0;
  m.shards.insert(m.shards.end(), d1->begin(), d1->end());
  // A manifest writer that only shares the file system computes the same digests.
  auto digested = DigestCheckpointShards(*staging, LayerShards(*model, 0, n));
  ASSERT_TRUE(digested.ok()) << digested.status();
  ASSERT_EQ(digested->size(), m.shards.size());
  for (size_t i = 0; i < m.shards.size(); ++i) {
    EXPECT_EQ((*digested)[i].sha256, m.shards[i].sha256) << m.shards[i].file;
    EXPECT_EQ((*digested)[i].bytes, m.shards[i].bytes) << m.shards[i].file;
  }
  ASSERT_TRUE(PublishCheckpoint(*staging, Dir("s"), m).ok());
  EXPECT_FALSE(fs::exists(*staging));

  auto one = Stage::Create(model.get(), 0, n, 7, Opts().optimizer);
  ASSERT_TRUE(one.ok());
  ASSERT_TRUE(SaveCheckpoint(Dir("one"), m, one->ExportState()).ok());
  for (const CheckpointShard& s : m.shards) {
    EXPECT_EQ(ReadAll(Dir("s") + "/" + s.file), ReadAll(Dir("one") + "/" + s.file)) << s.file;
  }
  EXPECT_EQ(ReadAll(Dir("s") + "/manifest.json"), ReadAll(Dir("one") + "/manifest.json"));
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
                                      R"({"format": "pipetrain.checkpoint.v2", "step": "x"})")
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

// The state of a reference trainer after `steps` steps.
std::map<std::string, math::Tensor> TrainedState(const Model& model, int steps) {
  auto t = ReferenceTrainer::Create(&model, Opts());
  EXPECT_TRUE(t.ok());
  for (int s = 0; s < steps; ++s) EXPECT_TRUE((*t)->Step(testing::MakeBatch(model, 4, s)).ok());
  return (*t)->ExportState();
}

json ReadManifestJson(const std::string& dir) {
  return json::parse(ReadAll(dir + "/manifest.json"));
}

void WriteManifestJson(const std::string& dir, const json& j) {
  ASSERT_TRUE(io::WriteFileAtomically(dir + "/manifest.json", j.dump(2)).ok());
}

std::vector<std::string> Entries(const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names = io::ListDirectory(dir);
  EXPECT_TRUE(names.ok()) << names.status();
  return names.ok() ? *names : std::vector<std::string>{};
}

// The file names a checkpoint of `model` consists of, sorted.
std::vector<std::string> CheckpointFiles(const Model& model) {
  std::vector<std::string> files = {kManifestName};
  for (const CheckpointShard& s : LayerShards(model, 0, model.num_layers())) {
    files.push_back(s.file);
  }
  std::sort(files.begin(), files.end());
  return files;
}

void ExpectSameTensors(const std::map<std::string, math::Tensor>& got,
                       const std::map<std::string, math::Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name;
    EXPECT_EQ(it->second.shape, t.shape) << name;
    EXPECT_EQ(it->second.data, t.data) << name;
  }
}

TEST_F(CheckpointTest, ManifestCarriesEveryShardsDigestAndSize) {
  auto model = testing::BuildOrDie(testing::kMlpSpec);
  ASSERT_TRUE(SaveCheckpoint(Dir("c"), ManifestFor(*model, 2), TrainedState(*model, 2)).ok());
  const json j = ReadManifestJson(Dir("c"));
  EXPECT_EQ(j["format"], "pipetrain.checkpoint.v2");
  ASSERT_EQ(j["shards"].size(), 4u);
  for (const json& shard : j["shards"]) {
    const std::string path = Dir("c") + "/" + shard["file"].get<std::string>();
    absl::StatusOr<io::FileDigest> d = io::DigestFile(path);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(shard["sha256"], d->sha256) << path;
    EXPECT_EQ(shard["bytes"], d->bytes) << path;
    EXPECT_EQ(shard["bytes"], static_cast<int64_t>(fs::file_size(path))) << path;
  }
  // The layer files keep their metadata format: they did not change with manifest v2.
  absl::StatusOr<io::SafetensorsFile> f =
      io::ReadSafetensors(Dir("c") + "/layer-00000.safetensors");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->metadata.at("format"), "pipetrain.checkpoint.v1");
  EXPECT_EQ(f->metadata.at("step"), "2");
}

TEST_F(CheckpointTest, TokenizerTravelsWithTheCheckpointVerified) {
  auto model = testing::BuildOrDie(testing::kMlpSpec);
  const std::string tokenizer = "not parsed here: any bytes of a tokenizer model";
  ASSERT_TRUE(
      SaveCheckpoint(Dir("c"), ManifestFor(*model, 2), TrainedState(*model, 2), 1, tokenizer).ok());
  EXPECT_EQ(ReadAll(Dir("c") + "/tokenizer.model"), tokenizer);
  const json j = ReadManifestJson(Dir("c"));
  EXPECT_EQ(j["tokenizer"]["file"], "tokenizer.model");
  EXPECT_EQ(j["tokenizer"]["sha256"], io::DigestBytes(tokenizer)->sha256);
  EXPECT_EQ(j["tokenizer"]["bytes"], static_cast<int64_t>(tokenizer.size()));
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(Dir("c"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->tokenizer, tokenizer);
  ASSERT_TRUE(loaded->manifest.tokenizer.has_value());
  EXPECT_EQ(loaded->manifest.tokenizer->bytes, static_cast<int64_t>(tokenizer.size()));

  // A changed tokenizer file is DATA_LOSS naming it; a missing one NOT_FOUND.
  std::string changed = tokenizer;
  changed[0] ^= 1;
  ASSERT_TRUE(io::WriteFileAtomically(Dir("c") + "/tokenizer.model", changed).ok());
  absl::Status s = LoadCheckpoint(Dir("c")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("tokenizer.model: SHA-256"));
  ASSERT_TRUE(io::WriteFileAtomically(Dir("c") + "/tokenizer.model", tokenizer + "x").ok());
  EXPECT_EQ(LoadCheckpoint(Dir("c")).status().code(), absl::StatusCode::kDataLoss);
  fs::remove(Dir("c") + "/tokenizer.model");
  EXPECT_EQ(LoadCheckpoint(Dir("c")).status().code(), absl::StatusCode::kNotFound);

  // A checkpoint directory with a tokenizer may be replaced, by one without: then it has none.
  ASSERT_TRUE(SaveCheckpoint(Dir("c"), ManifestFor(*model, 3), TrainedState(*model, 3)).ok());
  loaded = LoadCheckpoint(Dir("c"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE(loaded->manifest.tokenizer.has_value());
  EXPECT_TRUE(loaded->tokenizer.empty());
  EXPECT_FALSE(fs::exists(Dir("c") + "/tokenizer.model"));
}

TEST_F(CheckpointTest, ManifestTokenizerEntryIsChecked) {
  auto model = testing::BuildOrDie(testing::kMlpSpec);
  ASSERT_TRUE(
      SaveCheckpoint(Dir("c"), ManifestFor(*model, 2), TrainedState(*model, 2), 1, "tok").ok());
  const json good = ReadManifestJson(Dir("c"));
  for (const auto& [field, value, message] :
       std::vector<std::tuple<std::string, json, std::string>>{
           {"file", "../x", "'tokenizer.file' = '../x' is not tokenizer.model"},
           {"sha256", "abc", "'tokenizer.sha256' = 'abc' is not 64 lowercase hex"},
           {"bytes", -1, "tokenizer.bytes"},
       }) {
    json j = good;
    j["tokenizer"][field] = value;
    ASSERT_TRUE(io::WriteFileAtomically(Dir("c") + "/manifest.json", j.dump()).ok());
    absl::StatusOr<CheckpointManifest> m = ReadCheckpointManifest(Dir("c"));
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(m.status().message(), HasSubstr(message)) << field;
  }
}

TEST_F(CheckpointTest, ManifestRecordsTheInstructionSetAndItsHistory) {
  auto model = testing::BuildOrDie(testing::kMlpSpec);
  CheckpointManifest m = ManifestFor(*model, 2);
  m.isa = "x86-64-v4";
  ASSERT_TRUE(SaveCheckpoint(Dir("isa"), m, TrainedState(*model, 2)).ok());
  json j = ReadManifestJson(Dir("isa"));
  EXPECT_EQ(j["isa"], "x86-64-v4");
  EXPECT_FALSE(j.contains("isa_note"));  // every step ran at one level.
  absl::StatusOr<CheckpointManifest> read = ReadCheckpointManifest(Dir("isa"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->isa, "x86-64-v4");
  EXPECT_EQ(read->isa_note, "");
  // Resumed at the same level: no note; at another: the steps of each level, and notes add up.
  EXPECT_EQ(IsaNoteAfterResume(*read, "x86-64-v4"), "");
  const std::string note = IsaNoteAfterResume(*read, "x86-64-v3");
  EXPECT_EQ(note,
            "Steps up to 2 ran at x86-64-v4, later ones at x86-64-v3: the bits differ from a run "
            "that stayed on one instruction set.");
  CheckpointManifest later = *read;
  later.step = 5;
  later.isa = "x86-64-v3";
  later.isa_note = note;
  EXPECT_EQ(IsaNoteAfterResume(later, "x86-64-v3"), note);
  EXPECT_EQ(IsaNoteAfterResume(later, "x86-64-v4"),
            note +
                " Steps up to 5 ran at x86-64-v3, later ones at x86-64-v4: the bits differ "
                "from a run that stayed on one instruction set.");
  // Round trip of a note; a manifest without the fields (older writers) reads as unrecorded.
  CheckpointManifest with_note = *read;  // with the shards' digests, which a manifest needs.
  with_note.isa_note = note;
  ASSERT_TRUE(WriteCheckpointManifest(Dir("isa"), with_note).ok());
  read = ReadCheckpointManifest(Dir("isa"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->isa_note, note);
  j = ReadManifestJson(Dir("isa"));
  j.erase("isa");
  j.erase("isa_note");
  WriteManifestJson(Dir("isa"), j);
  read = ReadCheckpointManifest(Dir("isa"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->isa, "");
  j["isa"] = 4;
  WriteManifestJson(Dir("isa"), j);
  EXPECT_THAT(ReadCheckpointManifest(Dir("isa")).status().message(), HasSubstr("'isa'"));
}

TEST_F(CheckpointTest, FlippedByteOrTruncationIsDataLossNamingTheFile) {
  auto model = testing::BuildOrDie(testing::kMlpSpec);
  ASSERT_TRUE(SaveCheckpoint(Dir("c"), ManifestFor(*model, 2), TrainedState(*model, 2)).ok());
  const std::string file = Dir("c") + "/layer-00003.safetensors";
  const std::string good = ReadAll(file);
  ASSERT_GT(good.size(), 200u);

  // One bit of one weight: the file still parses, only the checksum notices.
  std::string flipped = good;
  flipped[good.size() - 5] ^= 0x01;
  ASSERT_TRUE(io::WriteFileAtomically(file, flipped).ok());
  ASSERT_TRUE(io::ParseSafetensors(flipped, file).ok());
  absl::Status s = LoadCheckpoint(Dir("c")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(file + ": SHA-256 "));
  EXPECT_THAT(s.message(), HasSubstr("corrupted"));
  EXPECT_EQ(VerifyCheckpoint(Dir("c")).status(), s);

  ASSERT_TRUE(io::WriteFileAtomically(file, good.substr(0, good.size() - 8)).ok());
  s = LoadCheckpoint(Dir("c")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(file, ": ", good.size() - 8,
                                                  " bytes, but the manifest says ", good.size())));

  ASSERT_TRUE(io::WriteFileAtomically(file, good).ok());
  EXPECT_TRUE(LoadCheckpoint(Dir("c")).ok());
  fs::remove(file);
  EXPECT_EQ(LoadCheckpoint(Dir("c")).status().code(), absl::StatusCode::kNotFound);
}

// A file the manifest names that is a symbolic link leading out of the checkpoint directory is
// not read, even when its bytes match the manifest (docs/checkpoints.md: links cannot lead out).
// Before, LoadCheckpoint followed the link and loaded the outside file. A link that stays inside
// the directory is followed.
TEST_F(CheckpointTest, SymbolicLinksLeadingOutOfTheCheckpointArePermissionDenied) {
  auto model = testing::BuildOrDie(testing::kMlpSpec);
  ASSERT_TRUE(SaveCheckpoint(Dir("c"), ManifestFor(*model, 2), TrainedState(*model, 2)).ok());
  const std::string file = Dir("c") + "/layer-00003.safetensors";
  const std::string outside = Dir("outside.safetensors");
  // The same bytes outside: only the link's target is wrong.
  fs::copy_file(file, outside);
  fs::remove(file);
  fs::create_symlink(outside, file);
  for (const absl::Status& s :
       {LoadCheckpoint(Dir("c")).status(), VerifyCheckpoint(Dir("c")).status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_THAT(s.message(), HasSubstr(file));
    EXPECT_THAT(s.message(), HasSubstr(outside));
  }
  // A relative link climbing out is the same.
  fs::remove(file);
  fs::create_symlink("../outside.safetensors", file);
  EXPECT_EQ(LoadCheckpoint(Dir("c")).status().code(), absl::StatusCode::kPermissionDenied);
  // A link to a file inside the directory is followed.
  fs::remove(file);
  fs::copy_file(outside, Dir("c") + "/real-layer-3");
  fs::create_symlink("real-layer-3", file);
  EXPECT_TRUE(LoadCheckpoint(Dir("c")).ok());

  // The manifest itself, linked from outside.
  const std::string manifest = Dir("c") + "/manifest.json";
  fs::copy_file(manifest, Dir("outside.json"));
  fs::remove(manifest);
  fs::create_symlink(Dir("outside.json"), manifest);
  absl::Status s = ReadCheckpointManifest(Dir("c")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(s.message(), HasSubstr(manifest));
  EXPECT_EQ(LoadCheckpoint(Dir("c")).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(CheckpointTest, ManifestWithoutChecksumsIsRefused) {
  auto model = testing::BuildOrDie(testing::kMlpSpec);
  ASSERT_TRUE(SaveCheckpoint(Dir("c"), ManifestFor(*model, 2), TrainedState(*model, 2)).ok());
  // What pipetrain wrote before checksums.
  json j = ReadManifestJson(Dir("c"));
  j["format"] = "pipetrain.checkpoint.v1";
  for (json& shard : j["shards"]) {
    shard.erase("sha256");
    shard.erase("bytes");
  }
  WriteManifestJson(Dir("c"), j);
  absl::Status s = LoadCheckpoint(Dir("c")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("pipetrain.checkpoint.v1 predates per-shard checksums"));
  // A v2 manifest missing one is malformed, and named.
  j = ReadManifestJson(Dir("c"));
  j["format"] = "pipetrain.checkpoint.v2";
  j["shards"][0]["sha256"] = std::string(64, 'a');
  j["shards"][0]["bytes"] = 1;
  j["shards"][1]["sha256"] = std::string(64, 'a');
  WriteManifestJson(Dir("c"), j);
  s = LoadCheckpoint(Dir("c")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("field 'shards[1].bytes' missing"));
  // Writers cannot produce one either.
  CheckpointManifest m = ManifestFor(*model, 2);  // shards without digests
  s = WriteCheckpointManifest(Dir("c"), m);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("field 'shards[0].sha256' = '' is not 64 lowercase hex"));
}

// A shard written at another step than the manifest's (e.g. a stale file) is DATA_LOSS naming
// the file and both steps, and is never published.
TEST_F(CheckpointTest, ShardOfAnotherStepIsDataLoss) {
  auto model = testing::BuildOrDie(testing::kMlpSpec);
  const auto state = TrainedState(*model, 3);
  ASSERT_TRUE(SaveCheckpoint(Dir("c"), ManifestFor(*model, 3), state).ok());
  absl::StatusOr<std::string> staging = BeginCheckpointStaging(Dir("c"));
  ASSERT_TRUE(staging.ok());
  auto shards = WriteCheckpointShards(*staging, LayerShards(*model, 0, 3), state, 4);
  auto stale = WriteCheckpointShards(*staging, LayerShards(*model, 3, 6), state, 3);
  ASSERT_TRUE(shards.ok() && stale.ok());
  CheckpointManifest m = ManifestFor(*model, 4);
  m.shards = *shards;
  m.shards.insert(m.shards.end(), stale->begin(), stale->end());
  ASSERT_TRUE(WriteCheckpointManifest(*staging, m).ok());
  absl::Status s = LoadCheckpoint(*staging).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(),
              HasSubstr(*staging + "/layer-00003.safetensors: written at step 3 but the "
                                   "manifest's step is 4"));

  s = PublishCheckpoint(*staging, Dir("c"), m);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(fs::exists(*staging));
  absl::StatusOr<LoadedCheckpoint> old = LoadCheckpoint(Dir("c"));
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->manifest.step, 3);
}

TEST_F(CheckpointTest, NonFiniteValuesAreDataLossNamingFileAndTensor) {
  auto model = testing::BuildOrDie(testing::kMlpSpec);
  const auto good = TrainedState(*model, 2);
  ASSERT_TRUE(SaveCheckpoint(Dir("c"), ManifestFor(*model, 2), good).ok());
  for (const char* tensor : {"optim.3.weight.exp_avg_sq", "layers.5.bias"}) {
    SCOPED_TRACE(tensor);
    auto bad = good;
    ASSERT_EQ(bad.count(tensor), 1u);
    const bool nan = absl::StartsWith(tensor, "optim");
    bad[tensor].data[1] = nan ? std::nanf("") : -INFINITY;
    // Written directly (no verification), as a buggy or foreign writer could.
    ASSERT_TRUE(io::EnsureDirectory(Dir("raw")).ok());
    auto shards = WriteCheckpointShards(Dir("raw"), LayerShards(*model, 0, 6), bad, 2);
    ASSERT_TRUE(shards.ok()) << shards.status();
    CheckpointManifest m = ManifestFor(*model, 2);
    m.shards = *shards;
    ASSERT_TRUE(WriteCheckpointManifest(Dir("raw"), m).ok());
    absl::Status s = LoadCheckpoint(Dir("raw")).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    const std::string file = nan ? "layer-00003.safetensors" : "layer-00005.safetensors";
    EXPECT_THAT(s.message(),
                HasSubstr(absl::StrCat(Dir("raw"), "/", file, ": tensor ", tensor, " holds ",
                                       nan ? "NaN" : "Inf", " at element 1")));
    // Saving it is refused the same way and keeps the previous checkpoint.
    s = SaveCheckpoint(Dir("c"), ManifestFor(*model, 3), bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(s.message(), HasSubstr(tensor));
    absl::StatusOr<LoadedCheckpoint> old = LoadCheckpoint(Dir("c"));
    ASSERT_TRUE(old.ok()) << old.status();
    EXPECT_EQ(old->manifest.step, 2);
    ExpectSameTensors(old->tensors, good);
    EXPECT_THAT(Entries(dir_.string()), ElementsAre("c", "raw"));
  }
}

TEST_F(CheckpointTest, ManifestNumbersAreRangeChecked) {
  auto model = testing::BuildOrDie(testing::kMlpSpec);
  ASSERT_TRUE(SaveCheckpoint(Dir("c"), ManifestFor(*model, 2), TrainedState(*model, 2)).ok());
  const json good = ReadManifestJson(Dir("c"));
  struct Case {
    const char* field;
    std::function<void(json&)> edit;
    const char* message;
  };
  const int64_t two53 = int64_t{1} << 53;
  const std::vector<Case> cases = {
      {"step", [](json& j) { j["step"] = -1; }, "field 'step' = -1 is out of range [0, 2^53)"},
      {"step", [&](json& j) { j["step"] = two53; },
       "field 'step' = 9007199254740992 is out of range [0, 2^53) (counters are converted to "
       "double"},
      {"step", [](json& j) { j["step"] = uint64_t{1} << 63; },
       "field 'step' = 9223372036854775808 "
       "does not fit in 64 bits"},
      {"batch_size", [](json& j) { j["batch_size"] = -8; }, "field 'batch_size' = -8"},
      {"microbatches", [](json& j) { j["microbatches"] = -1; }, "field 'microbatches' = -1"},
      {"data_cursor.epoch", [](json& j) { j["data_cursor"]["epoch"] = -1; },
       "field 'data_cursor.epoch' = -1"},
      {"data_cursor.batch", [&](json& j) { j["data_cursor"]["batch"] = two53 + 2; },
       "field 'data_cursor.batch' = 9007199254740994 is out of range"},
      {"bytes", [](json& j) { j["shards"][2]["bytes"] = -5; }, "field 'shards[2].bytes' = -5"},
      {"sha256", [](json& j) { j["shards"][1]["sha256"] = "ABC"; },
       "field 'shards[1].sha256' = 'ABC' is not 64 lowercase hex digits"},
      {"last_layer", [](json& j) { j["shards"][3]["last_layer"] = 7; },
       "'shards[3].last_layer' of layer-00005.safetensors: layer range [5, 7) is not a "
       "non-empty range within the model's 6 layers"},
      {"file", [](json& j) { j["shards"][1]["file"] = "layer-00000.safetensors"; },
       "shard file 'layer-00000.safetensors' is listed twice"},
      {"file", [](json& j) { j["shards"][1]["file"] = "../x"; },
       "field 'shards[1].file' = '../x' is not a plain file name"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    json j = good;
    c.edit(j);
    WriteManifestJson(Dir("c"), j);
    absl::Status s = LoadCheckpoint(Dir("c")).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(c.message));
    EXPECT_THAT(s.message(), HasSubstr(c.field));
  }
  // The writer refuses what the reader would.
  WriteManifestJson(Dir("c"), good);
  absl::StatusOr<CheckpointManifest> m = ReadCheckpointManifest(Dir("c"));
  ASSERT_TRUE(m.ok()) << m.status();
  m->step = two53;
  absl::Status s = WriteCheckpointManifest(Dir("c"), *m);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("field 'step' = 9007199254740992 is out of range"));
  m->step = two53 - 1;
  EXPECT_TRUE(WriteCheckpointManifest(Dir("c"), *m).ok());
}

// Saving over a checkpoint replaces the whole set: none of the old files survive (this model has
// no layer 1 or 4, the old one did), and nothing is left beside the directory.
TEST_F(CheckpointTest, SavingOverACheckpointReplacesTheWholeSet) {
  auto gpt = testing::BuildOrDie(testing::kGptSpec);
  auto mlp = testing::BuildOrDie(testing::kMlpSpec);
  ASSERT_TRUE(SaveCheckpoint(Dir("c"), ManifestFor(*gpt, 1), TrainedState(*gpt, 1)).ok());
  EXPECT_THAT(Entries(Dir("c")), ElementsAreArray(CheckpointFiles(*gpt)));
  const auto state = TrainedState(*mlp, 2);
  ASSERT_TRUE(SaveCheckpoint(Dir("c"), ManifestFor(*mlp, 2), state).ok());
  EXPECT_THAT(Entries(Dir("c")), ElementsAreArray(CheckpointFiles(*mlp)));
  EXPECT_THAT(Entries(dir_.string()), ElementsAre("c"));
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(Dir("c"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->manifest.step, 2);
  ExpectSameTensors(loaded->tensors, state);

  // The same bytes as a save into a fresh directory.
  ASSERT_TRUE(SaveCheckpoint(Dir("fresh"), ManifestFor(*mlp, 2), state).ok());
  for (const std::string& f : CheckpointFiles(*mlp)) {
    EXPECT_EQ(ReadAll(Dir("c") + "/" + f), ReadAll(Dir("fresh") + "/" + f)) << f;
  }
}

// A crash between writing the new files and publishing them: the directory still holds the old
// checkpoint, the abandoned staging directory is ignored, and the next save succeeds.
// keep = 3: the directory holds the newest checkpoint, the two before it are kept beside it under
// their steps' names, older ones go; each kept one loads with its own step's weights.
TEST_F(CheckpointTest, KeepHoldsTheNewestAndTheLatestEarlierOnes) {
  auto model = testing::BuildOrDie(testing::kGptSpec);
  auto trainer = ReferenceTrainer::Create(model.get(), Opts());
  ASSERT_TRUE(trainer.ok());
  std::map<int64_t, std::string> first_file;  // step -> bytes of its first layer file
  const std::string first = LayerShards(*model, 0, model->num_layers())[0].file;
  for (int64_t step = 1; step <= 4; ++step) {
    ASSERT_TRUE((*trainer)->Step(testing::MakeBatch(*model, 4, static_cast<int>(step))).ok());
    ASSERT_TRUE(
        SaveCheckpoint(Dir("run"), ManifestFor(*model, step), (*trainer)->ExportState(), 3).ok());
    first_file[step] = ReadAll(Dir("run") + "/" + first);
  }
  // The same step saved again is not kept twice.
  ASSERT_TRUE(
      SaveCheckpoint(Dir("run"), ManifestFor(*model, 4), (*trainer)->ExportState(), 3).ok());
  auto history = CheckpointHistory(Dir("run/"));
  ASSERT_TRUE(history.ok()) << history.status();
  ASSERT_EQ(history->size(), 2u);
  EXPECT_EQ((*history)[0].first, 3);
  EXPECT_EQ((*history)[0].second, Dir("run.step-000000000003"));
  EXPECT_EQ((*history)[1].first, 2);
  EXPECT_FALSE(fs::exists(Dir("run.step-000000000001")));
  EXPECT_EQ(CheckpointHistoryPath(Dir("run/"), 2), Dir("run.step-000000000002"));
  for (int64_t step : {2, 3}) {
    auto loaded = LoadCheckpoint(CheckpointHistoryPath(Dir("run"), step));
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->manifest.step, step);
    EXPECT_EQ(ReadAll(CheckpointHistoryPath(Dir("run"), step) + "/" + first), first_file[step]);
  }
  auto newest = LoadCheckpoint(Dir("run"));
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(newest->manifest.step, 4);
  // keep = 1 prunes every earlier one; a name that only looks similar stays.
  fs::create_directories(Dir("run.step-12"));
  ASSERT_TRUE(
      SaveCheckpoint(Dir("run"), ManifestFor(*model, 5), (*trainer)->ExportState(), 1).ok());
  history = CheckpointHistory(Dir("run"));
  ASSERT_TRUE(history.ok());
  EXPECT_TRUE(history->empty());
  EXPECT_TRUE(fs::exists(Dir("run.step-12")));
  EXPECT_TRUE(absl::IsInvalidArgument(
      SaveCheckpoint(Dir("run"), ManifestFor(*model, 6), (*trainer)->ExportState(), 0)));
}

TEST_F(CheckpointTest, CrashBeforePublishLeavesTheOldCheckpoint) {
  auto model = testing::BuildOrDie(testing::kMlpSpec);
  const auto old_state = TrainedState(*model, 1);
  const auto new_state = TrainedState(*model, 3);
  ASSERT_TRUE(SaveCheckpoint(Dir("c"), ManifestFor(*model, 1), old_state).ok());
  absl::StatusOr<std::string> staging = BeginCheckpointStaging(Dir("c"));
  ASSERT_TRUE(staging.ok());
  auto shards =
      WriteCheckpointShards(*staging, LayerShards(*model, 0, model->num_layers()), new_state, 3);
  ASSERT_TRUE(shards.ok());
  CheckpointManifest m = ManifestFor(*model, 3);
  m.shards = *shards;
  ASSERT_TRUE(WriteCheckpointManifest(*staging, m).ok());
  // "Crash": the staging directory is never published.
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(Dir("c"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->manifest.step, 1);
  ExpectSameTensors(loaded->tensors, old_state);
  EXPECT_EQ(io::StagingTarget(fs::path(*staging).filename().string()), "c");

  ASSERT_TRUE(SaveCheckpoint(Dir("c"), ManifestFor(*model, 3), new_state).ok());
  loaded = LoadCheckpoint(Dir("c"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->manifest.step, 3);
  ExpectSameTensors(loaded->tensors, new_state);
  EXPECT_TRUE(fs::exists(*staging));  // left for CheckpointStore::Open or the operator
  ASSERT_TRUE(DiscardCheckpointStaging(*staging).ok());
  EXPECT_THAT(Entries(dir_.string()), ElementsAre("c"));
}

// A failed shard writer: the staging directory is discarded, the destination never touched, and
// a writer that comes late cannot recreate the discarded directory.
TEST_F(CheckpointTest, DiscardedStagingCannotBeWrittenInto) {
  auto model = testing::BuildOrDie(testing::kMlpSpec);
  absl::StatusOr<std::string> staging = BeginCheckpointStaging(Dir("c"));
  ASSERT_TRUE(staging.ok());
  ASSERT_TRUE(DiscardCheckpointStaging(*staging).ok());
  auto late =
      WriteCheckpointShards(*staging, LayerShards(*model, 0, 2), TrainedState(*model, 0), 0);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(late.status().message(), HasSubstr(*staging));
  EXPECT_FALSE(fs::exists(*staging));
  EXPECT_FALSE(fs::exists(Dir("c")));
}

// A directory that holds anything but a checkpoint is never replaced (`--save ~` must not
// delete a home directory); empty directories and old-format checkpoints are.
TEST_F(CheckpointTest, RefusesToReplaceADirectoryThatIsNotACheckpoint) {
  auto model = testing::BuildOrDie(testing::kMlpSpec);
  const auto state = TrainedState(*model, 1);
  ASSERT_TRUE(io::EnsureDirectory(Dir("home")).ok());
  ASSERT_TRUE(io::WriteFileAtomically(Dir("home") + "/notes.txt", "keep me").ok());
  absl::Status s = SaveCheckpoint(Dir("home"), ManifestFor(*model, 1), state);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("'" + Dir("home") + "' holds 'notes.txt'"));
  EXPECT_EQ(CheckCheckpointDestination(Dir("home")), s);
  EXPECT_EQ(ReadAll(Dir("home") + "/notes.txt"), "keep me");
  EXPECT_THAT(Entries(dir_.string()), ElementsAre("home"));

  ASSERT_TRUE(io::EnsureDirectory(Dir("home") + "/sub").ok());
  fs::remove(Dir("home") + "/notes.txt");
  EXPECT_THAT(CheckCheckpointDestination(Dir("home")).message(), HasSubstr("holds 'sub'"));

  ASSERT_TRUE(io::WriteFileAtomically(Dir("file"), "x").ok());
  EXPECT_EQ(CheckCheckpointDestination(Dir("file")).code(), absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE(io::EnsureDirectory(Dir("target")).ok());
  fs::create_directory_symlink(Dir("target"), Dir("link"));
  EXPECT_THAT(CheckCheckpointDestination(Dir("link")).message(),
              HasSubstr("'" + Dir("link") + "' is a symbolic link"));

  // An empty directory (e.g. made by mkdtemp or a --save check) is replaced.
  ASSERT_TRUE(io::EnsureDirectory(Dir("empty")).ok());
  EXPECT_TRUE(CheckCheckpointDestination(Dir("empty")).ok());
  EXPECT_TRUE(SaveCheckpoint(Dir("empty"), ManifestFor(*model, 1), state).ok());
  // A missing one, below missing parents, is fine.
  EXPECT_TRUE(CheckCheckpointDestination(Dir("x/y/z")).ok());
  EXPECT_TRUE(fs::is_directory(Dir("x/y")));
  EXPECT_FALSE(fs::exists(Dir("x/y/z")));

  // An old-format checkpoint with other shard names and a leftover temporary is replaced.
  ASSERT_TRUE(SaveCheckpoint(Dir("old"), ManifestFor(*model, 1), state).ok());
  json j = ReadManifestJson(Dir("old"));
  j["format"] = "pipetrain.checkpoint.v1";
  j["shards"][0]["file"] = "stage-0.safetensors";
  WriteManifestJson(Dir("old"), j);
  fs::rename(Dir("old") + "/layer-00000.safetensors", Dir("old") + "/stage-0.safetensors");
  ASSERT_TRUE(io::WriteFileAtomically(Dir("old") + "/manifest.json.tmp.1.2.3", "x").ok());
  ASSERT_TRUE(SaveCheckpoint(Dir("old"), ManifestFor(*model, 1), state).ok());
  EXPECT_THAT(Entries(Dir("old")), ElementsAreArray(CheckpointFiles(*model)));
}

// Checkpoint paths with a NUL byte: before, "c\0x" loaded (and saved into) "c".
TEST_F(CheckpointTest, PathsWithANulByteAreInvalidArgument) {
  auto model = testing::BuildOrDie(testing::kMlpSpec);
  ASSERT_TRUE(SaveCheckpoint(Dir("c"), ManifestFor(*model, 2), TrainedState(*model, 2)).ok());
  const std::string nul = Dir("c") + std::string(1, '\0') + "x";
  for (const absl::Status& s :
       {ReadCheckpointManifest(nul).status(), LoadCheckpoint(nul).status(),
        VerifyCheckpoint(nul).status(), CheckCheckpointDestination(nul),
        BeginCheckpointStaging(nul).status(),
        SaveCheckpoint(nul, ManifestFor(*model, 3), TrainedState(*model, 3)),
        WriteCheckpointManifest(nul, ManifestFor(*model, 3)),
        DigestCheckpointShards(nul, LayerShards(*model, 0, model->num_layers())).status(),
        DiscardCheckpointStaging(nul), CheckpointHistory(nul).status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr("path contains a NUL byte")) << s;
  }
  absl::StatusOr<CheckpointManifest> m = ReadCheckpointManifest(Dir("c"));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->step, 2);  // not overwritten by the save into "c\0x".
}

// Resuming: the optimizer kind (which decides the state tensors) must be the checkpoint's; its
// hyper-parameters may change.
TEST(CheckOptimizerResumesTest, KindMustMatchHyperParametersMayChange) {
  CheckpointManifest m;
  m.optimizer =
      "adamw:lr=0.00999999978,weight_decay=0,beta1=0.899999976,beta2=0.999000013,"
      "eps=9.99999994e-09,clip_norm=0";
  math::OptimizerConfig sgd = *math::ParseOptimizerConfig("sgd:lr=0.1,momentum=0.9");
  math::OptimizerConfig adamw = *math::ParseOptimizerConfig("adamw:lr=0.5,weight_decay=0.1");
  EXPECT_TRUE(CheckOptimizerResumes("ckpt", m, adamw).ok());
  absl::Status s = CheckOptimizerResumes("ckpt", m, sgd);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "ckpt: the checkpoint was trained with optimizer adamw, this run asks for sgd; its "
            "state tensors are adamw's, so resume with --optimizer adamw[:key=value,...] (the "
            "hyper-parameters may change, the kind may not)");
  m.optimizer = "sgd:lr=0.1";
  EXPECT_TRUE(CheckOptimizerResumes("ckpt", m, sgd).ok());
  EXPECT_THAT(CheckOptimizerResumes("ckpt", m, adamw).message(),
              HasSubstr("trained with optimizer sgd, this run asks for adamw"));
  m.optimizer = "rmsprop";
  s = CheckOptimizerResumes("ckpt", m, sgd);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("ckpt: the manifest's optimizer 'rmsprop' does not parse"));
}

}  // namespace
}  // namespace pipetrain::model
