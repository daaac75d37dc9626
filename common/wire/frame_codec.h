// Tensor <-> pipetrain.v1.Frame codec over grpc::ByteBuffer: the only place where the data plane's
// domain types (TensorKey, job/generation, math::Matrix) meet the protobuf wire form.
//
// Sending aliases the tensor's memory (no copy): a Frame is two slices, [header bytes, tag and
// length of `payload`] followed by a slice that points into the Matrix and keeps it alive through
// its destroy callback. Receiving validates every header field before use and copies the payload
// once, straight into the destination Matrix. The byte layout is documented in docs/wire.md.
#ifndef PIPETRAIN_COMMON_WIRE_FRAME_CODEC_H_
#define PIPETRAIN_COMMON_WIRE_FRAME_CODEC_H_

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/math/tensor.h"
#include "common/wire/tensor_key.h"
#include "common/wire/tensor_reassembler.h"

namespace pipetrain::wire {

// Fragment ("chunk size" in DESIGN.md §5) limits: a tensor's bytes are sent in pieces of at most
// this many payload bytes per Frame.
inline constexpr int64_t kMinFragmentBytes = int64_t{1} << 20;
inline constexpr int64_t kMaxFragmentBytes = int64_t{4} << 20;
inline constexpr int64_t kDefaultFragmentBytes = kMinFragmentBytes;
// Largest serialized FrameHeader accepted (a real one is well under 100 bytes).
inline constexpr int64_t kMaxHeaderBytes = 4096;
// Largest legal encoded Frame: a maximal fragment plus header and tags. gRPC receive limits on
// Exchange streams are set to this on both sides.
inline constexpr int64_t kMaxFrameMessageBytes = kMaxFragmentBytes + kMaxHeaderBytes + 32;

// Bit of `kind` in FrameValidation::allowed_kinds.
constexpr uint32_t KindBit(TensorKind kind) { return uint32_t{1} << static_cast<int>(kind); }
inline constexpr uint32_t kAllKinds =
    KindBit(TensorKind::kActivation) | KindBit(TensorKind::kGradient) |
    KindBit(TensorKind::kInput) | KindBit(TensorKind::kTarget) |
    KindBit(TensorKind::kTiedGradient) | KindBit(TensorKind::kReplicaGradient) |
    KindBit(TensorKind::kCopyGradient);

// The (job, generation) a stream carries; every frame on it names both.
struct StreamIdentity {
  std::string job;
  int64_t generation = 0;
};

// What a receiver accepts on one stream. Codes of the rejections (see CONVENTIONS.md item 4):
// other job, malformed header, shape, byte counts or fragment order: INVALID_ARGUMENT; other
// generation: ABORTED; step outside [min_step, max_step]: FAILED_PRECONDITION; a dimension, tensor
// or fragment over its limit: RESOURCE_EXHAUSTED.
struct FrameValidation {
  StreamIdentity expected;  // frames must name this job and generation.
  int64_t min_step = 0;     // accepted steps: [min_step, max_step].
  int64_t max_step = std::numeric_limits<int64_t>::max();
  int32_t num_microbatches = 1;  // M: microbatch in [0, M).
  int32_t num_chunks = 1;        // S*V model chunks: chunk in [0, num_chunks), and per kind
                                 // (tensor_key.h): activation chunk >= 1, gradient chunk
                                 // <= num_chunks - 2, input chunk 0, target the last chunk.
  // The chunks are two copies of num_chunks / 2 stages (bidirectional DualPipe,
  // schedule::PlacementKind::kBidirectional): an input may also name chunk num_chunks / 2 (the
  // first of the up copy) and a target chunk num_chunks / 2 - 1 (the last of the down copy).
  // Without it a copy_gradient frame is refused.
  bool two_copies = false;
  uint32_t allowed_kinds = kAllKinds;              // KindBit()s of the kinds this stream may carry.
  int64_t max_dim = int64_t{1} << 24;              // limit on rows and on cols.
  int64_t max_tensor_bytes = int64_t{512} << 20;   // limit on a whole tensor.
  int64_t max_fragment_bytes = kMaxFragmentBytes;  // limit on one frame's payload.
  // Rounds of the job's replica reduction (2 log2(replicas); 0 with one replica, which refuses
  // every replica_gradient frame). Such a frame's micro-batch field is segment * replica_rounds +
  // round (tensor_key.h), any value >= 0.
  int32_t replica_rounds = 0;

  // OK if the limits are usable (M >= 1, chunks >= 1, limits > 0, step range non-empty);
  // INVALID_ARGUMENT otherwise.
  absl::Status Check() const;
};

// Number of frames a tensor of `total_bytes` takes with fragments of `fragment_bytes` (> 0).
int64_t NumFragments(int64_t total_bytes, int64_t fragment_bytes);

// Encodes bytes [offset, offset + length) of `tensor` as one Frame into `*out` (replacing its
// contents). The payload slice aliases tensor->data() + offset: `*out` and every copy gRPC makes
// of it hold a reference to `tensor`, released when the last slice is destroyed, so the caller may
// drop its own reference at once but must not modify the tensor while a frame is in flight.
// Errors: INVALID_ARGUMENT for a null or empty tensor, bad key, or a range outside the tensor or
// longer than kMaxFragmentBytes. Thread-safe (pure).
absl::Status EncodeFragment(const StreamIdentity& id, const TensorKey& key,
                            const std::shared_ptr<const math::Matrix>& tensor, int64_t offset,
                            int64_t length, grpc::ByteBuffer* out);

// Encodes all of `tensor` as NumFragments(bytes, fragment_bytes) frames in order (each as by
// EncodeFragment). fragment_bytes must be in [1, kMaxFragmentBytes] (the link enforces 1-4 MiB;
// smaller values are allowed here for tests). Thread-safe (pure).
absl::StatusOr<std::vector<grpc::ByteBuffer>> EncodeTensor(
    const StreamIdentity& id, const TensorKey& key,
    const std::shared_ptr<const math::Matrix>& tensor, int64_t fragment_bytes);

// Encodes a credit grant of `bytes` (> 0, else INVALID_ARGUMENT) into `*out`.
absl::Status EncodeCredit(int64_t bytes, grpc::ByteBuffer* out);

// One decoded Frame.
struct DecodedFrame {
  enum class Type {
    kCredit,    // a credit grant: credit_bytes.
    kPartial,   // a tensor fragment that did not complete its tensor: key, payload_bytes.
    kComplete,  // the last fragment of a tensor: key, payload_bytes and the whole tensor.
  };
  Type type = Type::kCredit;
  int64_t credit_bytes = 0;   // kCredit only.
  int64_t payload_bytes = 0;  // kPartial / kComplete: tensor bytes this frame carried.
  TensorKey key;              // kPartial / kComplete.
  math::Matrix tensor;        // kComplete only: the reassembled [rows, cols] tensor.
  // kComplete from a shared TensorReassembler only: when its first fragment arrived (on any
  // stream of the link).
  std::optional<TensorReassembler::Clock::time_point> first_fragment;
};

// Decodes and validates the Frames of one direction of one stream, reassembling fragmented
// tensors. Not thread-safe: one decoder per stream direction, fed in arrival order.
class FrameDecoder {
 public:
  // `validation` should pass Check(); a decoder with unusable limits rejects every frame.
  explicit FrameDecoder(FrameValidation validation);
  // A decoder of one stripe of a striped link: fragments go to `shared` (one per link, shared by
  // the decoders of all its streams), so they may come at any offset and in any order, on any
  // stream; overlaps are refused, and the frame that completes a tensor returns it, whichever
  // stream it came on. Null `shared`: the one-stream decoder above.
  FrameDecoder(FrameValidation validation, std::shared_ptr<TensorReassembler> shared);

  FrameDecoder(const FrameDecoder&) = delete;
  FrameDecoder& operator=(const FrameDecoder&) = delete;

  // Decodes one received Frame message. On success the payload has been copied (once) into the
  // tensor under assembly. Errors (see FrameValidation for codes) name the field and the tensor;
  // after an error the partial tensor is dropped and the stream should be closed.
  // `buffer` is only read; its slices may be released by the caller afterwards.
  absl::StatusOr<DecodedFrame> Decode(const grpc::ByteBuffer& buffer);

  // True if no tensor is partially assembled.
  bool idle() const { return !assembly_.has_value(); }

 private:
  struct Assembly {
    TensorKey key;
    int64_t total_bytes = 0;
    int64_t received_bytes = 0;
    math::Matrix tensor;
  };

  const FrameValidation validation_;
  const absl::Status validation_status_;  // validation_.Check(), computed once.
  std::optional<Assembly> assembly_;
  const std::shared_ptr<TensorReassembler> shared_;  // striped links only.
};

}  // namespace pipetrain::wire

#endif  // PIPETRAIN_COMMON_WIRE_FRAME_CODEC_H_
