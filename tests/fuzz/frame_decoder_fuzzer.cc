// libFuzzer target: the data plane's tensor frame decoder (common/wire/frame_codec), fed a
// sequence of messages as one stream direction would receive them.
//
// Input: byte 0 chooses M (1 + b % 8), byte 1 the chunk count (1 + b % 8), then messages, each a
// 2-byte little-endian length and that many bytes; a message is split into up to three slices at
// positions taken from its first bytes, as gRPC may deliver it. Decoding stops at the first error
// (the stream would be closed). Invariants checked: a completed tensor has the shape and byte
// count its frames promised and lies within the limits.
#include <grpcpp/impl/grpc_library.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/wire/frame_codec.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // grpc::Slice and grpc::ByteBuffer need the gRPC library's codegen interface installed.
  static grpc::internal::GrpcLibraryInitializer initializer;
  initializer.summon();
  if (size < 2) return 0;
  pipetrain::wire::FrameValidation validation;
  validation.expected = {"job-fuzz", 1};
  validation.num_microbatches = 1 + data[0] % 8;
  validation.num_chunks = 1 + data[1] % 8;
  // Small limits: a header may promise a tensor up to them, which the decoder allocates.
  validation.max_dim = 4096;
  validation.max_tensor_bytes = int64_t{1} << 20;
  validation.max_fragment_bytes = int64_t{1} << 16;
  pipetrain::wire::FrameDecoder decoder(validation);
  size_t pos = 2;
  while (pos + 2 <= size) {
    const size_t length = data[pos] | (size_t{data[pos + 1]} << 8);
    pos += 2;
    const size_t n = length < size - pos ? length : size - pos;
    const auto* bytes = reinterpret_cast<const char*>(data + pos);
    pos += n;
    // Up to three slices, cut at positions derived from the message's own bytes.
    std::vector<grpc::Slice> slices;
    const size_t cut1 = n == 0 ? 0 : static_cast<uint8_t>(bytes[0]) % (n + 1);
    const size_t cut2 = n == 0 ? 0 : cut1 + static_cast<uint8_t>(bytes[n - 1]) % (n - cut1 + 1);
    if (cut1 > 0) slices.emplace_back(bytes, cut1);
    if (cut2 > cut1) slices.emplace_back(bytes + cut1, cut2 - cut1);
    if (n > cut2) slices.emplace_back(bytes + cut2, n - cut2);
    grpc::ByteBuffer buffer(slices.data(), slices.size());
    absl::StatusOr<pipetrain::wire::DecodedFrame> frame = decoder.Decode(buffer);
    if (!frame.ok()) {
      PT_FUZZ_CHECK(decoder.idle());  // an error drops the partial tensor
      break;
    }
    if (frame->type == pipetrain::wire::DecodedFrame::Type::kCredit) {
      PT_FUZZ_CHECK(frame->credit_bytes > 0);
    } else {
      PT_FUZZ_CHECK(frame->payload_bytes > 0 &&
                    frame->payload_bytes <= validation.max_fragment_bytes);
      PT_FUZZ_CHECK(frame->key.microbatch >= 0 &&
                    frame->key.microbatch < validation.num_microbatches);
      PT_FUZZ_CHECK(frame->key.chunk >= 0 && frame->key.chunk < validation.num_chunks);
    }
    if (frame->type == pipetrain::wire::DecodedFrame::Type::kComplete) {
      const pipetrain::math::Matrix& t = frame->tensor;
      PT_FUZZ_CHECK(t.rows() >= 1 && t.cols() >= 1 && t.rows() <= validation.max_dim &&
                    t.cols() <= validation.max_dim);
      PT_FUZZ_CHECK(static_cast<int64_t>(t.size()) * 4 <= validation.max_tensor_bytes);
      PT_FUZZ_CHECK(decoder.idle());
    }
  }
  return 0;
}
