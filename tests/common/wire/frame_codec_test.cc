#include "common/wire/frame_codec.h"

#include <grpcpp/impl/grpc_library.h>
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/tensor.pb.h"

namespace pipetrain::wire {
namespace {

using ::testing::HasSubstr;
namespace pb = ::pipetrain::v1;

// Installs gRPC's codegen interface so tests can build grpc::Slices themselves.
grpc::internal::GrpcLibraryInitializer g_grpc_initializer;

constexpr char kJob[] = "job-7";
constexpr int64_t kGeneration = 3;

StreamIdentity Id() { return StreamIdentity{kJob, kGeneration}; }

FrameValidation Validation() {
  FrameValidation v;
  v.expected = Id();
  v.num_microbatches = 4;
  v.num_chunks = 3;
  return v;
}

std::shared_ptr<const math::Matrix> RandomMatrix(int64_t rows, int64_t cols, uint32_t seed) {
  auto m = std::make_shared<math::Matrix>(rows, cols);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> bits;
  for (int64_t i = 0; i < m->size(); ++i) {
    const uint32_t b = bits(rng);
    std::memcpy(m->data() + i, &b, 4);  // any bit pattern, NaNs included: the codec is bitwise.
  }
  return m;
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// A ByteBuffer holding `bytes`, split into slices of `piece` bytes (0: one slice).
grpc::ByteBuffer MakeBuffer(const std::string& bytes, size_t piece = 0) {
  std::vector<grpc::Slice> slices;
  if (piece == 0) piece = bytes.size() + 1;
  for (size_t at = 0; at < bytes.size(); at += piece) {
    slices.emplace_back(bytes.substr(at, piece));
  }
  if (slices.empty()) return grpc::ByteBuffer();
  return grpc::ByteBuffer(slices.data(), slices.size());
}

bool BitwiseEqual(const math::Matrix& a, const math::Matrix& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A well-formed header for `key` with shape [rows, cols], fragment at `offset`.
pb::FrameHeader Header(const TensorKey& key, int64_t rows, int64_t cols, int64_t offset = 0) {
  pb::FrameHeader h;
  h.set_job(kJob);
  h.set_generation(kGeneration);
  h.set_step(key.step);
  h.set_microbatch(key.microbatch);
  h.set_chunk(key.chunk);
  h.set_kind(static_cast<pb::TensorKind>(key.kind));
  h.set_dtype(pb::DTYPE_F32);
  h.add_shape(rows);
  h.add_shape(cols);
  h.set_total_bytes(rows * cols * 4);
  h.set_offset(offset);
  return h;
}

// Serialized Frame from a header and payload (through the generated code).
std::string FrameBytes(const pb::FrameHeader& header, const std::string& payload) {
  pb::Frame frame;
  *frame.mutable_header() = header;
  frame.set_payload(payload);
  return frame.SerializeAsString();
}

absl::Status DecodeOne(const std::string& bytes, FrameValidation v = Validation()) {
  FrameDecoder decoder(v);
  return decoder.Decode(MakeBuffer(bytes)).status();
}

const TensorKey kKey{5, 2, 1, TensorKind::kActivation};

TEST(FrameCodecTest, RoundTripSmallTensorIsBitwise) {
  auto m = RandomMatrix(3, 5, 1);
  auto frames = EncodeTensor(Id(), kKey, m, kDefaultFragmentBytes);
  ASSERT_TRUE(frames.ok()) << frames.status();
  ASSERT_EQ(frames->size(), 1u);
  FrameDecoder decoder(Validation());
  auto decoded = decoder.Decode((*frames)[0]);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->type, DecodedFrame::Type::kComplete);
  EXPECT_EQ(decoded->key, kKey);
  EXPECT_EQ(decoded->payload_bytes, 60);
  EXPECT_TRUE(BitwiseEqual(decoded->tensor, *m));
  EXPECT_TRUE(decoder.idle());
}

struct ChunkCase {
  int64_t rows, cols, fragment;
};

class FrameCodecChunkTest : public ::testing::TestWithParam<ChunkCase> {};

TEST_P(FrameCodecChunkTest, RoundTripFragmentedIsBitwise) {
  const ChunkCase c = GetParam();
  auto m = RandomMatrix(c.rows, c.cols, 7);
  const int64_t total = c.rows * c.cols * 4;
  auto frames = EncodeTensor(Id(), kKey, m, c.fragment);
  ASSERT_TRUE(frames.ok()) << frames.status();
  ASSERT_EQ(static_cast<int64_t>(frames->size()), NumFragments(total, c.fragment));
  FrameDecoder decoder(Validation());
  int64_t carried = 0;
  for (size_t i = 0; i < frames->size(); ++i) {
    // Re-slice the received bytes unevenly, as a transport may.
    grpc::ByteBuffer received = MakeBuffer(Flatten((*frames)[i]), 1 + (i * 977) % 8191);
    auto decoded = decoder.Decode(received);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    carried += decoded->payload_bytes;
    EXPECT_EQ(decoded->key, kKey);
    if (i + 1 < frames->size()) {
      EXPECT_EQ(decoded->type, DecodedFrame::Type::kPartial);
      EXPECT_FALSE(decoder.idle());
    } else {
      EXPECT_EQ(decoded->type, DecodedFrame::Type::kComplete);
      EXPECT_TRUE(BitwiseEqual(decoded->tensor, *m));
    }
  }
  EXPECT_EQ(carried, total);
  EXPECT_TRUE(decoder.idle());
}

INSTANTIATE_TEST_SUITE_P(Sizes, FrameCodecChunkTest,
                         ::testing::Values(ChunkCase{1, 1, 1}, ChunkCase{7, 3, 5},
                                           ChunkCase{13, 17, 64}, ChunkCase{1000, 1037, 1 << 20},
                                           ChunkCase{1024, 1024, 1 << 20},
                                           ChunkCase{257, 4099, 4 << 20},
                                           ChunkCase{3, 262145, (1 << 20) + 3}));

TEST(FrameCodecTest, EncodingIsAValidProtobufFrame) {
  auto m = RandomMatrix(64, 33, 3);
  auto frames = EncodeTensor(Id(), kKey, m, 1000);
  ASSERT_TRUE(frames.ok());
  int64_t offset = 0;
  for (const grpc::ByteBuffer& b : *frames) {
    pb::Frame frame;
    ASSERT_TRUE(frame.ParseFromString(Flatten(b)));
    ASSERT_TRUE(frame.has_header());
    const pb::FrameHeader& h = frame.header();
    EXPECT_EQ(h.job(), kJob);
    EXPECT_EQ(h.generation(), kGeneration);
    EXPECT_EQ(h.step(), kKey.step);
    EXPECT_EQ(h.microbatch(), kKey.microbatch);
    EXPECT_EQ(h.chunk(), kKey.chunk);
    EXPECT_EQ(h.kind(), pb::TENSOR_KIND_ACTIVATION);
    EXPECT_EQ(h.dtype(), pb::DTYPE_F32);
    ASSERT_EQ(h.shape_size(), 2);
    EXPECT_EQ(h.shape(0), 64);
    EXPECT_EQ(h.shape(1), 33);
    EXPECT_EQ(h.total_bytes(), 64 * 33 * 4);
    EXPECT_EQ(h.offset(), offset);
    EXPECT_EQ(frame.payload(), std::string(reinterpret_cast<const char*>(m->data()) + offset,
                                           frame.payload().size()));
    offset += static_cast<int64_t>(frame.payload().size());
  }
  EXPECT_EQ(offset, 64 * 33 * 4);
}

TEST(FrameCodecTest, SendingAliasesTheTensorAndKeepsItAlive) {
  auto m = RandomMatrix(512, 1024, 4);  // 2 MiB: two fragments of 1 MiB.
  const float* data = m->data();
  std::vector<grpc::ByteBuffer> frames;
  {
    auto encoded = EncodeTensor(Id(), kKey, m, kDefaultFragmentBytes);
    ASSERT_TRUE(encoded.ok());
    frames = std::move(*encoded);
  }
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(m.use_count(), 3);  // ours + one per frame's payload slice.
  for (size_t i = 0; i < frames.size(); ++i) {
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(frames[i].Dump(&slices).ok());
    ASSERT_EQ(slices.size(), 2u);
    EXPECT_LT(slices[0].size(), 100u);  // header + payload tag and length.
    EXPECT_EQ(reinterpret_cast<const char*>(slices[1].begin()),
              reinterpret_cast<const char*>(data) + i * kDefaultFragmentBytes);
    EXPECT_EQ(slices[1].size(), static_cast<size_t>(kDefaultFragmentBytes));
  }
  // The frames keep the tensor alive after the sender drops it.
  std::weak_ptr<const math::Matrix> weak = m;
  m.reset();
  EXPECT_FALSE(weak.expired());
  frames.clear();
  EXPECT_TRUE(weak.expired());
}

TEST(FrameCodecTest, CreditRoundTrip) {
  grpc::ByteBuffer b;
  ASSERT_TRUE(EncodeCredit(12345, &b).ok());
  FrameDecoder decoder(Validation());
  auto decoded = decoder.Decode(b);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->type, DecodedFrame::Type::kCredit);
  EXPECT_EQ(decoded->credit_bytes, 12345);
  EXPECT_EQ(EncodeCredit(0, &b).code(), absl::StatusCode::kInvalidArgument);
}

TEST(FrameCodecTest, CreditFramesMayInterleaveFragments) {
  auto m = RandomMatrix(10, 10, 9);
  auto frames = EncodeTensor(Id(), kKey, m, 150);
  ASSERT_TRUE(frames.ok());
  grpc::ByteBuffer credit;
  ASSERT_TRUE(EncodeCredit(1, &credit).ok());
  FrameDecoder decoder(Validation());
  for (const grpc::ByteBuffer& f : *frames) {
    ASSERT_TRUE(decoder.Decode(credit).ok());
    auto decoded = decoder.Decode(f);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    if (decoded->type == DecodedFrame::Type::kComplete) {
      EXPECT_TRUE(BitwiseEqual(decoded->tensor, *m));
    }
  }
}

TEST(FrameCodecTest, EncodeRejectsBadInput) {
  grpc::ByteBuffer out;
  auto m = RandomMatrix(2, 2, 1);
  EXPECT_EQ(EncodeFragment(Id(), kKey, nullptr, 0, 4, &out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeFragment(Id(), kKey, std::make_shared<math::Matrix>(0, 3), 0, 4, &out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeFragment(Id(), kKey, m, 8, 9, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeFragment(Id(), kKey, m, -1, 4, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeFragment(Id(), kKey, m, 0, 0, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeFragment(Id(), TensorKey{-1, 0, 0, TensorKind::kGradient}, m, 0, 4, &out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      EncodeFragment(Id(), TensorKey{0, 0, 0, static_cast<TensorKind>(9)}, m, 0, 4, &out).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeTensor(Id(), kKey, m, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeTensor(Id(), kKey, m, kMaxFragmentBytes + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// One header mutation and the status it must produce.
struct BadHeaderCase {
  const char* name;
  void (*mutate)(pb::FrameHeader*);
  absl::StatusCode code;
  const char* message;  // substring of the error message.
};

class FrameCodecBadHeaderTest : public ::testing::TestWithParam<BadHeaderCase> {};

TEST_P(FrameCodecBadHeaderTest, RejectedWithExactCode) {
  const BadHeaderCase& c = GetParam();
  pb::FrameHeader h = Header(kKey, 2, 3);
  c.mutate(&h);
  const int64_t payload = h.total_bytes() > 0 && h.total_bytes() <= 24 ? h.total_bytes() : 24;
  absl::Status status = DecodeOne(FrameBytes(h, std::string(payload, 'x')));
  EXPECT_EQ(status.code(), c.code) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(c.message));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, FrameCodecBadHeaderTest,
    ::testing::Values(
        BadHeaderCase{"WrongJob", [](pb::FrameHeader* h) { h->set_job("other"); },
                      absl::StatusCode::kInvalidArgument, "job 'other'"},
        BadHeaderCase{"StaleGeneration", [](pb::FrameHeader* h) { h->set_generation(kGeneration - 1); },
                      absl::StatusCode::kAborted, "generation 2"},
        BadHeaderCase{"FutureGeneration", [](pb::FrameHeader* h) { h->set_generation(kGeneration + 1); },
                      absl::StatusCode::kAborted, "stale frame"},
        BadHeaderCase{"UnspecifiedKind",
                      [](pb::FrameHeader* h) { h->set_kind(pb::TENSOR_KIND_UNSPECIFIED); },
                      absl::StatusCode::kInvalidArgument, "unknown tensor kind 0"},
        BadHeaderCase{"UnknownKind",
                      [](pb::FrameHeader* h) { h->set_kind(static_cast<pb::TensorKind>(9)); },
                      absl::StatusCode::kInvalidArgument, "unknown tensor kind 9"},
        BadHeaderCase{"NegativeStep", [](pb::FrameHeader* h) { h->set_step(-1); },
                      absl::StatusCode::kInvalidArgument, "negative step"},
        BadHeaderCase{"NegativeMicrobatch", [](pb::FrameHeader* h) { h->set_microbatch(-1); },
                      absl::StatusCode::kInvalidArgument, "micro-batch -1 outside [0, 4)"},
        BadHeaderCase{"MicrobatchTooLarge", [](pb::FrameHeader* h) { h->set_microbatch(4); },
                      absl::StatusCode::kInvalidArgument, "micro-batch 4 outside [0, 4)"},
        BadHeaderCase{"ChunkTooLarge", [](pb::FrameHeader* h) { h->set_chunk(3); },
                      absl::StatusCode::kInvalidArgument, "chunk 3 outside [0, 3)"},
        BadHeaderCase{"ActivationOfChunk0", [](pb::FrameHeader* h) { h->set_chunk(0); },
                      absl::StatusCode::kInvalidArgument, "activation cannot name chunk 0"},
        BadHeaderCase{"GradientOfLastChunk",
                      [](pb::FrameHeader* h) {
                        h->set_kind(pb::TENSOR_KIND_GRADIENT);
                        h->set_chunk(2);
                      },
                      absl::StatusCode::kInvalidArgument, "gradient cannot name chunk 2"},
        BadHeaderCase{"InputNotChunk0",
                      [](pb::FrameHeader* h) { h->set_kind(pb::TENSOR_KIND_INPUT); },
                      absl::StatusCode::kInvalidArgument, "input cannot name chunk 1"},
        BadHeaderCase{"TargetNotLastChunk",
                      [](pb::FrameHeader* h) { h->set_kind(pb::TENSOR_KIND_TARGET); },
                      absl::StatusCode::kInvalidArgument, "target cannot name chunk 1"},
        BadHeaderCase{"TiedGradientOfAMiddleChunk",
                      [](pb::FrameHeader* h) { h->set_kind(pb::TENSOR_KIND_TIED_GRADIENT); },
                      absl::StatusCode::kInvalidArgument, "tied_gradient cannot name chunk 1"},
        BadHeaderCase{"StaleTiedGradient",
                      [](pb::FrameHeader* h) {
                        h->set_kind(pb::TENSOR_KIND_TIED_GRADIENT);
                        h->set_chunk(0);
                        h->set_generation(kGeneration - 1);
                      },
                      absl::StatusCode::kAborted, "stale frame tied_gradient"},
        BadHeaderCase{"NoDtype", [](pb::FrameHeader* h) { h->set_dtype(pb::DTYPE_UNSPECIFIED); },
                      absl::StatusCode::kInvalidArgument, "only F32"},
        BadHeaderCase{"Rank1", [](pb::FrameHeader* h) { h->mutable_shape()->RemoveLast(); },
                      absl::StatusCode::kInvalidArgument, "rank 1"},
        BadHeaderCase{"Rank3", [](pb::FrameHeader* h) { h->add_shape(1); },
                      absl::StatusCode::kInvalidArgument, "rank 3"},
        BadHeaderCase{"ZeroDim", [](pb::FrameHeader* h) { h->set_shape(0, 0); },
                      absl::StatusCode::kInvalidArgument, "dimension 0 is 0"},
        BadHeaderCase{"NegativeDim", [](pb::FrameHeader* h) { h->set_shape(1, -3); },
                      absl::StatusCode::kInvalidArgument, "dimension 1 is -3"},
        BadHeaderCase{"HugeDim", [](pb::FrameHeader* h) { h->set_shape(1, int64_t{1} << 40); },
                      absl::StatusCode::kResourceExhausted, "limit"},
        BadHeaderCase{"HugeTensor",
                      [](pb::FrameHeader* h) {
                        h->set_shape(0, 1 << 20);
                        h->set_shape(1, 1 << 20);
                      },
                      absl::StatusCode::kResourceExhausted, "exceeds the limit"},
        BadHeaderCase{"TotalBytesMismatch", [](pb::FrameHeader* h) { h->set_total_bytes(25); },
                      absl::StatusCode::kInvalidArgument, "total_bytes 25"},
        BadHeaderCase{"NegativeOffset", [](pb::FrameHeader* h) { h->set_offset(-4); },
                      absl::StatusCode::kInvalidArgument, "outside the tensor"},
        BadHeaderCase{"OffsetPastEnd", [](pb::FrameHeader* h) { h->set_offset(4); },
                      absl::StatusCode::kInvalidArgument, "outside the tensor"}),
    [](const ::testing::TestParamInfo<BadHeaderCase>& param) { return param.param.name; });

TEST(FrameCodecTest, StepOutsideWindowIsFailedPrecondition) {
  FrameValidation v = Validation();
  v.min_step = 6;
  v.max_step = 9;
  absl::Status status = DecodeOne(FrameBytes(Header(kKey, 2, 3), std::string(24, 'x')), v);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("activation(step=5, mb=2, chunk=1)"));
}

TEST(FrameCodecTest, KindNotAllowedOnStream) {
  FrameValidation v = Validation();
  v.allowed_kinds = KindBit(TensorKind::kGradient);
  absl::Status status = DecodeOne(FrameBytes(Header(kKey, 2, 3), std::string(24, 'x')), v);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("not accepted on this stream"));
}

// The tied embedding's gradient parts (docs/wire.md, "Gradient exchange") name the chunk of the
// receiving end, 0 or the last, and only streams that allow the kind carry them.
TEST(FrameCodecTest, TiedGradientNamesAnEndAndNeedsItsKindAllowed) {
  for (int32_t chunk : {0, 2}) {
    const TensorKey key{5, 0, chunk, TensorKind::kTiedGradient};
    EXPECT_TRUE(DecodeOne(FrameBytes(Header(key, 2, 3), std::string(24, 'x'))).ok()) << chunk;
    FrameValidation v = Validation();
    v.allowed_kinds = KindBit(TensorKind::kActivation) | KindBit(TensorKind::kGradient);
    const absl::Status refused = DecodeOne(FrameBytes(Header(key, 2, 3), std::string(24, 'x')), v);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    EXPECT_THAT(std::string(refused.message()),
                HasSubstr("tied_gradient frames are not accepted on this stream"));
  }
}

// A replica's reduction message (docs/wire.md, "Gradient exchange") names any chunk; its
// micro-batch field is segment * rounds + round, not bounded by the job's micro-batches; a stream
// of a job without replicas refuses it, and only streams that allow the kind (a replica peer's)
// carry it.
TEST(FrameCodecTest, ReplicaGradientCarriesARoundAndNeedsItsKindAllowed) {
  FrameValidation v = Validation();  // 4 micro-batches, 3 chunks.
  v.replica_rounds = 6;              // 8 replicas.
  for (int32_t chunk : {0, 1, 2}) {
    const TensorKey key{5, 6 * 3 + 5, chunk, TensorKind::kReplicaGradient};  // segment 3, round 5.
    const absl::Status ok = DecodeOne(FrameBytes(Header(key, 2, 3), std::string(24, 'x')), v);
    EXPECT_TRUE(ok.ok()) << chunk << ": " << ok;
  }
  // One replica: no replica_gradient at all.
  const TensorKey first{5, 0, 1, TensorKind::kReplicaGradient};
  const absl::Status none = DecodeOne(FrameBytes(Header(first, 2, 3), std::string(24, 'x')));
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument) << none;
  EXPECT_THAT(std::string(none.message()), HasSubstr("a job without replicas"));
  v.allowed_kinds = KindBit(TensorKind::kActivation) | KindBit(TensorKind::kGradient);
  const absl::Status refused = DecodeOne(FrameBytes(Header(first, 2, 3), std::string(24, 'x')), v);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("replica_gradient frames are not accepted on this stream"));
}

// The two copies of a stage under dualpipe (docs/wire.md, "The copies of a stage"): a
// copy_gradient frame names the receiving copy's chunk, its micro-batch field is segment * 2 +
// round (not bounded by the job's micro-batches, never negative), and only a job with two copies
// accepts it; there the up copy's first chunk takes inputs and the down copy's last targets.
TEST(FrameCodecTest, CopyGradientNeedsTwoCopiesAndCarriesARound) {
  FrameValidation two = Validation();  // 4 micro-batches.
  two.num_chunks = 4;
  two.two_copies = true;
  ASSERT_TRUE(two.Check().ok());
  for (int32_t chunk = 0; chunk < 4; ++chunk) {
    for (int32_t field : {0, 1, 2 * 7 + 1}) {  // segment 7, round 1.
      const TensorKey key{5, field, chunk, TensorKind::kCopyGradient};
      EXPECT_TRUE(DecodeOne(FrameBytes(Header(key, 2, 3), std::string(24, 'x')), two).ok())
          << chunk << " " << field;
    }
  }
  const TensorKey negative{5, -1, 2, TensorKind::kCopyGradient};
  absl::Status refused = DecodeOne(FrameBytes(Header(negative, 2, 3), std::string(24, 'x')), two);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("negative segment and round -1"));
  FrameValidation one = two;
  one.two_copies = false;
  const TensorKey key{5, 0, 2, TensorKind::kCopyGradient};
  refused = DecodeOne(FrameBytes(Header(key, 2, 3), std::string(24, 'x')), one);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("copy_gradient cannot name chunk 2 of 4"));
  const TensorKey input{5, 2, 2, TensorKind::kInput};
  const TensorKey target{5, 1, 1, TensorKind::kTarget};
  EXPECT_TRUE(DecodeOne(FrameBytes(Header(input, 2, 3), std::string(24, 'x')), two).ok());
  EXPECT_TRUE(DecodeOne(FrameBytes(Header(target, 2, 3), std::string(24, 'x')), two).ok());
  EXPECT_FALSE(DecodeOne(FrameBytes(Header(input, 2, 3), std::string(24, 'x')), one).ok());
  EXPECT_FALSE(DecodeOne(FrameBytes(Header(target, 2, 3), std::string(24, 'x')), one).ok());
  FrameValidation odd = two;
  odd.num_chunks = 3;
  EXPECT_EQ(odd.Check().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FrameCodecTest, PayloadLengthErrors) {
  const pb::FrameHeader h = Header(kKey, 2, 3);
  EXPECT_EQ(DecodeOne(FrameBytes(h, "")).code(), absl::StatusCode::kInvalidArgument);
  // Longer than the tensor.
  EXPECT_EQ(DecodeOne(FrameBytes(h, std::string(28, 'x'))).code(),
            absl::StatusCode::kInvalidArgument);
  // Longer than the fragment limit.
  FrameValidation v = Validation();
  v.max_fragment_bytes = 16;
  absl::Status status = DecodeOne(FrameBytes(h, std::string(24, 'x')), v);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("fragment limit of 16"));
}

// The tensor and dimension caps (FrameValidation::max_tensor_bytes, the worker's
// --max-tensor-bytes, and max_dim): a header promising one element over is RESOURCE_EXHAUSTED
// before anything is allocated; a tensor exactly at the cap decodes.
TEST(FrameCodecTest, TensorCapAtTheLimitDecodesOneOverIsResourceExhausted) {
  FrameValidation v = Validation();
  v.max_tensor_bytes = 2 * 3 * 4;
  EXPECT_TRUE(DecodeOne(FrameBytes(Header(kKey, 2, 3), std::string(24, 'x')), v).ok());
  v.max_tensor_bytes = 2 * 3 * 4 - 1;
  absl::Status status = DecodeOne(FrameBytes(Header(kKey, 2, 3), std::string(24, 'x')), v);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("tensor [2, 3] exceeds the limit of 23"));
  // A header promising 2^24 x 2^24 floats with a 24-byte payload.
  status = DecodeOne(FrameBytes(Header(kKey, 1 << 24, 1 << 24), std::string(24, 'x')));
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  v = Validation();
  v.max_dim = 3;
  EXPECT_TRUE(DecodeOne(FrameBytes(Header(kKey, 2, 3), std::string(24, 'x')), v).ok());
  v.max_dim = 2;
  status = DecodeOne(FrameBytes(Header(kKey, 2, 3), std::string(24, 'x')), v);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("shape dimension 1 is 3, limit 2"));
}

TEST(FrameCodecTest, StructuralErrors) {
  EXPECT_EQ(DecodeOne("").code(), absl::StatusCode::kInvalidArgument);
  pb::Frame only_payload;
  only_payload.set_payload("abcd");
  EXPECT_EQ(DecodeOne(only_payload.SerializeAsString()).code(), absl::StatusCode::kInvalidArgument);
  // A credit with a payload.
  pb::Frame credit_payload;
  credit_payload.mutable_credit()->set_bytes(5);
  credit_payload.set_payload("abcd");
  EXPECT_EQ(DecodeOne(credit_payload.SerializeAsString()).code(),
            absl::StatusCode::kInvalidArgument);
  // A non-positive credit.
  pb::Frame zero_credit;
  zero_credit.mutable_credit();
  EXPECT_EQ(DecodeOne(zero_credit.SerializeAsString()).code(), absl::StatusCode::kInvalidArgument);
  // Header and credit both (concatenated encodings).
  pb::Frame credit;
  credit.mutable_credit()->set_bytes(5);
  const std::string good = FrameBytes(Header(kKey, 2, 3), std::string(24, 'x'));
  EXPECT_EQ(DecodeOne(good + credit.SerializeAsString()).code(),
            absl::StatusCode::kInvalidArgument);
  // The header twice.
  absl::Status twice = DecodeOne(good + good);
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(twice.message()), HasSubstr("appears twice"));
  // Truncated.
  EXPECT_EQ(DecodeOne(good.substr(0, good.size() - 1)).code(), absl::StatusCode::kInvalidArgument);
  // A header that is not a FrameHeader.
  EXPECT_EQ(DecodeOne(std::string("\x0a\x02\xff\xff", 4)).code(),
            absl::StatusCode::kInvalidArgument);
  // Wrong wire type for the header (varint).
  EXPECT_EQ(DecodeOne(std::string("\x08\x01", 2)).code(), absl::StatusCode::kInvalidArgument);
  // A group (wire type 3).
  EXPECT_EQ(DecodeOne(good + std::string("\x1b", 1)).code(), absl::StatusCode::kInvalidArgument);
  // Field number 0.
  EXPECT_EQ(DecodeOne(std::string("\x02\x00", 2)).code(), absl::StatusCode::kInvalidArgument);
  // An oversized header.
  pb::FrameHeader big = Header(kKey, 2, 3);
  big.set_job(std::string(kMaxHeaderBytes, 'j'));
  EXPECT_EQ(DecodeOne(FrameBytes(big, std::string(24, 'x'))).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(FrameCodecTest, UnknownFieldsAreSkipped) {
  const std::string good = FrameBytes(Header(kKey, 2, 3), std::string(24, 'x'));
  // Field 3 varint, field 4 fixed64, field 5 length-delimited, field 6 fixed32.
  const std::string extra(
      "\x18\x96\x01\x21\x01\x02\x03\x04\x05\x06\x07\x08\x2a\x02hi\x35\x01\x02\x03\x04", 21);
  FrameDecoder decoder(Validation());
  auto decoded = decoder.Decode(MakeBuffer(extra + good));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->type, DecodedFrame::Type::kComplete);
}

TEST(FrameCodecTest, FragmentSequenceMustBeContiguous) {
  auto m = RandomMatrix(4, 8, 2);  // 128 bytes.
  auto frames = EncodeTensor(Id(), kKey, m, 32);
  ASSERT_TRUE(frames.ok());
  ASSERT_EQ(frames->size(), 4u);
  {  // Starts mid-tensor.
    FrameDecoder decoder(Validation());
    absl::Status s = decoder.Decode((*frames)[1]).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("expected byte 0"));
  }
  {  // Skips a fragment.
    FrameDecoder decoder(Validation());
    ASSERT_TRUE(decoder.Decode((*frames)[0]).ok());
    absl::Status s = decoder.Decode((*frames)[2]).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("fragment at byte 64, expected byte 32"));
    EXPECT_TRUE(decoder.idle());
  }
  {  // An empty message mid-tensor (found by the frame_decoder fuzzer: the partial tensor was
     // kept after this error).
    FrameDecoder decoder(Validation());
    ASSERT_TRUE(decoder.Decode((*frames)[0]).ok());
    ASSERT_FALSE(decoder.idle());
    EXPECT_EQ(decoder.Decode(MakeBuffer("")).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(decoder.idle());
  }
  {  // Repeats a fragment.
    FrameDecoder decoder(Validation());
    ASSERT_TRUE(decoder.Decode((*frames)[0]).ok());
    EXPECT_EQ(decoder.Decode((*frames)[0]).status().code(), absl::StatusCode::kInvalidArgument);
  }
  {  // Another tensor interrupts.
    FrameDecoder decoder(Validation());
    ASSERT_TRUE(decoder.Decode((*frames)[0]).ok());
    TensorKey other = kKey;
    other.microbatch = 3;
    auto interloper = EncodeTensor(Id(), other, m, 32);
    ASSERT_TRUE(interloper.ok());
    absl::Status s = decoder.Decode((*interloper)[0]).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("interrupts activation(step=5, mb=2"));
  }
  {  // Same key, different shape.
    FrameDecoder decoder(Validation());
    ASSERT_TRUE(decoder.Decode((*frames)[0]).ok());
    auto reshaped = EncodeTensor(Id(), kKey, RandomMatrix(8, 4, 2), 32);
    ASSERT_TRUE(reshaped.ok());
    EXPECT_EQ(decoder.Decode((*reshaped)[1]).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(FrameCodecTest, UnusableValidationRejectsEverything) {
  FrameValidation v = Validation();
  v.num_microbatches = 0;
  EXPECT_EQ(v.Check().code(), absl::StatusCode::kInvalidArgument);
  grpc::ByteBuffer credit;
  ASSERT_TRUE(EncodeCredit(1, &credit).ok());
  FrameDecoder decoder(v);
  EXPECT_EQ(decoder.Decode(credit).status().code(), absl::StatusCode::kInvalidArgument);
}

// Mutates encoded frames at random (bit flips, byte overwrites, truncation, insertion,
// re-slicing) and feeds them to long-lived and fresh decoders: every outcome must be a status or a
// tensor of consistent size, never a crash (run under ASan/UBSan for full effect).
TEST(FrameCodecTest, FuzzedFramesNeverCrash) {
  std::vector<std::string> corpus;
  for (auto [rows, cols, fragment] :
       {std::tuple<int, int, int>{2, 3, 24}, {5, 7, 40}, {16, 16, 300}}) {
    auto frames = EncodeTensor(Id(), kKey, RandomMatrix(rows, cols, rows), fragment);
    ASSERT_TRUE(frames.ok());
    for (const grpc::ByteBuffer& b : *frames) corpus.push_back(Flatten(b));
  }
  grpc::ByteBuffer credit;
  ASSERT_TRUE(EncodeCredit(4096, &credit).ok());
  corpus.push_back(Flatten(credit));

  std::mt19937 rng(20240611);
  FrameDecoder sticky(Validation());
  int ok = 0, errors = 0;
  for (int iteration = 0; iteration < 30000; ++iteration) {
    std::string bytes = corpus[rng() % corpus.size()];
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < mutations && !bytes.empty(); ++k) {
      const size_t at = rng() % bytes.size();
      switch (rng() % 5) {
        case 0:
          bytes[at] = static_cast<char>(bytes[at] ^ (1 << (rng() % 8)));
          break;
        case 1:
          bytes[at] = static_cast<char>(rng());
          break;
        case 2:
          bytes.resize(at);
          break;
        case 3:
          bytes.insert(at, 1 + rng() % 8, static_cast<char>(rng()));
          break;
        case 4:
          bytes[at] = static_cast<char>(0x80 | rng());  // long varints.
          break;
      }
    }
    const grpc::ByteBuffer buffer = MakeBuffer(bytes, 1 + rng() % 64);
    for (FrameDecoder* decoder : {&sticky}) {
      auto decoded = decoder->Decode(buffer);
      if (decoded.ok()) {
        ++ok;
        if (decoded->type == DecodedFrame::Type::kComplete) {
          EXPECT_GT(decoded->tensor.size(), 0);
        }
      } else {
        ++errors;
        EXPECT_NE(decoded.status().code(), absl::StatusCode::kOk);
      }
    }
    FrameDecoder fresh(Validation());
    (void)fresh.Decode(buffer);
  }
  EXPECT_GT(errors, 0);
  EXPECT_GT(ok + errors, 0);
}

}  // namespace
}  // namespace pipetrain::wire
