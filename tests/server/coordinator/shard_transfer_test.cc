// ShardUpload and ShardDownload: files arrive in chunks, digested as they come, published under
// their names only when complete and as announced; a download reads them back chunk by chunk.
#include "server/coordinator/shard_transfer.h"

#include <unistd.h>

#include <filesystem>
#include <string>

#include "common/io/digest.h"
#include "common/io/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/worker_control.pb.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::HasSubstr;

class ShardTransferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "shard_transfer_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    for (size_t i = 0; i < bytes_.size(); ++i) bytes_[i] = static_cast<char>(i * 7 + 3);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  UploadTarget Target() const {
    UploadTarget t;
    t.staging = dir_;
    model::CheckpointShard s;
    s.file = "layers-0-2.safetensors";
    s.first_layer = 0;
    s.last_layer = 2;
    t.files[s.file] = s;
    return t;
  }

  // The chunk of bytes_[offset, offset + n); the first carries the file's entry.
  v1::StateChunk Chunk(int64_t offset, int64_t n, const std::string& sha256) const {
    v1::StateChunk c;
    c.set_file("layers-0-2.safetensors");
    c.set_offset(offset);
    c.set_data(bytes_.substr(static_cast<size_t>(offset), static_cast<size_t>(n)));
    if (offset == 0) {
      c.set_first_layer(0);
      c.set_last_layer(2);
      c.set_bytes(static_cast<int64_t>(bytes_.size()));
      c.set_sha256(sha256);
    }
    return c;
  }

  std::string Sha() const { return io::DigestBytes(bytes_)->sha256; }

  std::string dir_;
  std::string bytes_ = std::string(3 * 1000 + 17, '\0');
};

TEST_F(ShardTransferTest, ChunksBecomeTheFileOnlyOnceCompleteAndAsAnnounced) {
  int writes = 0;
  ShardUpload upload(Target(), [&](const std::string& part) {
    ++writes;
    EXPECT_EQ(part, dir_ + "/layers-0-2.safetensors.part");
  });
  ASSERT_TRUE(upload.Write(Chunk(0, 1000, Sha())).ok());
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/layers-0-2.safetensors"));
  EXPECT_EQ(upload.Finish().code(), absl::StatusCode::kDataLoss);  // ended early.
  ASSERT_TRUE(upload.Write(Chunk(1000, 2000, "")).ok());
  ASSERT_TRUE(upload.Write(Chunk(3000, 17, "")).ok());
  EXPECT_TRUE(upload.Finish().ok());
  EXPECT_EQ(writes, 3);
  EXPECT_EQ(upload.files(), 1);
  EXPECT_EQ(upload.bytes(), 3017);
  absl::StatusOr<std::string> stored = io::ReadFile(dir_ + "/layers-0-2.safetensors");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(*stored, bytes_);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/layers-0-2.safetensors.part"));
  // Each file is accepted once.
  const absl::Status twice = upload.Write(Chunk(0, 10, Sha()));
  EXPECT_EQ(twice.code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(ShardTransferTest, BytesThatDoNotMatchTheAnnouncedDigestAreRefusedAndRemoved) {
  std::string wrong = Sha();
  wrong[0] = wrong[0] == '0' ? '1' : '0';
  {
    ShardUpload upload(Target(), nullptr);
    const absl::Status s = upload.Write(Chunk(0, 3017, wrong));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(s.message(), HasSubstr("the worker announced " + wrong));
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

TEST_F(ShardTransferTest, AGapOrAStrangerFileIsRefusedAndThePartialFileRemoved) {
  {
    ShardUpload upload(Target(), nullptr);
    ASSERT_TRUE(upload.Write(Chunk(0, 1000, Sha())).ok());
    const absl::Status gap = upload.Write(Chunk(1500, 100, ""));
    EXPECT_EQ(gap.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(gap.message(), HasSubstr("does not continue the 1000 of 3017 bytes"));
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir_));  // the upload's end removed the .part file.
  ShardUpload upload(Target(), nullptr);
  v1::StateChunk stranger = Chunk(0, 10, Sha());
  stranger.set_file("layers-2-3.safetensors");
  EXPECT_EQ(upload.Write(stranger).code(), absl::StatusCode::kPermissionDenied);
  v1::StateChunk bad_layers = Chunk(0, 10, Sha());
  bad_layers.set_last_layer(3);
  EXPECT_EQ(upload.Write(bad_layers).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ShardTransferTest, ADownloadReadsTheFilesBackInChunksWithTheirEntries) {
  const std::string big(static_cast<size_t>(ShardDownload::kChunkBytes) + 5, 'x');
  ASSERT_TRUE(io::WriteFileAtomically(dir_ + "/a", big).ok());
  ASSERT_TRUE(io::WriteFileAtomically(dir_ + "/b", "").ok());
  StateFile a{model::CheckpointShard(), dir_ + "/a", dir_};
  a.shard.file = "a";
  a.shard.bytes = static_cast<int64_t>(big.size());
  a.shard.sha256 = io::DigestBytes(big)->sha256;
  StateFile b{model::CheckpointShard(), dir_ + "/b", dir_};
  b.shard.file = "b";
  ShardDownload download({a, b});
  v1::StateChunk chunk;
  std::string received;
  std::vector<std::string> files;
  for (int i = 0; i < 10; ++i) {
    absl::StatusOr<bool> more = download.Next(&chunk);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    if (chunk.offset() == 0) files.push_back(chunk.file() + ":" + std::to_string(chunk.bytes()));
    if (chunk.file() == "a") received += chunk.data();
  }
  EXPECT_EQ(received, big);
  EXPECT_THAT(files, ::testing::ElementsAre("a:" + std::to_string(big.size()), "b:0"));
}

// A download opens its files confined to the checkpoint's directory: a link leading out of it is
// PERMISSION_DENIED, not read.
TEST_F(ShardTransferTest, ALinkLeadingOutOfTheCheckpointIsNotRead) {
  const std::string outside = dir_ + "_outside";
  ASSERT_TRUE(io::WriteFileAtomically(outside, "secret").ok());
  std::filesystem::create_symlink(outside, dir_ + "/a");
  StateFile a{model::CheckpointShard(), dir_ + "/a", dir_};
  a.shard.file = "a";
  a.shard.bytes = 6;
  ShardDownload download({a});
  v1::StateChunk chunk;
  EXPECT_EQ(download.Next(&chunk).status().code(), absl::StatusCode::kPermissionDenied);
  std::filesystem::remove(outside);
}

TEST_F(ShardTransferTest, AFileShorterThanItsManifestIsDataLoss) {
  ASSERT_TRUE(io::WriteFileAtomically(dir_ + "/a", "abc").ok());
  StateFile a{model::CheckpointShard(), dir_ + "/a", dir_};
  a.shard.file = "a";
  a.shard.bytes = 10;
  ShardDownload download({a});
  v1::StateChunk chunk;
  EXPECT_EQ(download.Next(&chunk).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace pipetrain::coordinator
