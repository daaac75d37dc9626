#include "common/wire/frame_codec.h"

#include <grpcpp/impl/grpc_library.h>
#include <grpcpp/support/slice.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "pipetrain/v1/tensor.pb.h"

namespace pipetrain::wire {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the wire carries little-endian float32; add a byte swap for big-endian hosts");

namespace pb = ::pipetrain::v1;

// Wire tags of Frame's fields (field number << 3 | wire type 2 = length-delimited).
constexpr uint8_t kHeaderTag = (1 << 3) | 2;
constexpr uint8_t kPayloadTag = (15 << 3) | 2;
constexpr int kHeaderField = 1;
constexpr int kCreditField = 2;
constexpr int kPayloadField = 15;

// grpc::Slice and grpc::ByteBuffer call through g_core_codegen_interface, which the gRPC C++
// library installs from static initializers of its own translation units. A codec used before any
// channel or server exists (tests, tools) must make sure it is installed.
void EnsureGrpcCodegen() {
  static grpc::internal::GrpcLibraryInitializer initializer;
  initializer.summon();
}

// Destroy callback of payload slices: drops the frame's reference to the tensor.
void ReleaseTensor(void* user_data) {
  delete static_cast<std::shared_ptr<const math::Matrix>*>(user_data);
}

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

bool ValidKind(int kind) {
  switch (static_cast<TensorKind>(kind)) {
    case TensorKind::kActivation:
    case TensorKind::kGradient:
    case TensorKind::kInput:
    case TensorKind::kTarget:
    case TensorKind::kTiedGradient:
    case TensorKind::kReplicaGradient:
    case TensorKind::kCopyGradient:
      return true;
  }
  return false;
}

absl::Status CheckKey(const TensorKey& key) {
  if (!ValidKind(static_cast<int>(key.kind))) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor key has an unknown kind ", static_cast<int>(key.kind)));
  }
  if (key.step < 0 || key.microbatch < 0 || key.chunk < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor key ", key.ToString(), " has a negative field"));
  }
  return absl::OkStatus();
}

// Sequential reader over the slices of a received message, plus random-access copies.
class SliceReader {
 public:
  explicit SliceReader(const std::vector<grpc::Slice>& slices) : slices_(slices) {
    for (const grpc::Slice& s : slices_) size_ += static_cast<int64_t>(s.size());
  }

  int64_t size() const { return size_; }
  int64_t position() const { return position_; }
  int64_t remaining() const { return size_ - position_; }

  // Reads a base-128 varint; false if truncated or longer than 10 bytes.
  bool ReadVarint(uint64_t* value) {
    uint64_t result = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t byte;
      if (!ReadByte(&byte)) return false;
      result |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if ((byte & 0x80) == 0) {
        *value = result;
        return true;
      }
    }
    return false;
  }

  // Advances by n bytes; false (without moving) if fewer remain.
  bool Skip(uint64_t n) {
    if (n > static_cast<uint64_t>(remaining())) return false;
    int64_t left = static_cast<int64_t>(n);
    while (left > 0) {
      const int64_t in_slice = static_cast<int64_t>(slices_[index_].size()) - offset_;
      const int64_t step = std::min(left, in_slice);
      offset_ += step;
      position_ += step;
      left -= step;
      NormalizeCursor();
    }
    NormalizeCursor();
    return true;
  }

  // Returns a pointer to bytes [at, at + n) if they lie within one slice, else nullptr.
  const char* Contiguous(int64_t at, int64_t n) const {
    int64_t base = 0;
    for (const grpc::Slice& s : slices_) {
      const int64_t len = static_cast<int64_t>(s.size());
      if (at < base + len) {
        if (at + n > base + len) return nullptr;
        return reinterpret_cast<const char*>(s.begin()) + (at - base);
      }
      base += len;
    }
    return nullptr;
  }

  // Copies bytes [at, at + n) (in range) to dst.
  void CopyOut(int64_t at, int64_t n, char* dst) const {
    int64_t base = 0;
    for (const grpc::Slice& s : slices_) {
      const int64_t len = static_cast<int64_t>(s.size());
      if (n == 0) return;
      if (at < base + len) {
        const int64_t from = at - base;
        const int64_t take = std::min(n, len - from);
        std::memcpy(dst, reinterpret_cast<const char*>(s.begin()) + from, take);
        dst += take;
        at += take;
        n -= take;
      }
      base += len;
    }
  }

 private:
  bool ReadByte(uint8_t* byte) {
    NormalizeCursor();
    if (index_ >= slices_.size()) return false;
    *byte = slices_[index_].begin()[offset_];
    ++offset_;
    ++position_;
    NormalizeCursor();
    return true;
  }

  // Moves the cursor past exhausted (or empty) slices.
  void NormalizeCursor() {
    while (index_ < slices_.size() && offset_ >= static_cast<int64_t>(slices_[index_].size())) {
      ++index_;
      offset_ = 0;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  int64_t size_ = 0;
  size_t index_ = 0;
  int64_t offset_ = 0;  // within slices_[index_].
  int64_t position_ = 0;
};

// Location of a length-delimited field's bytes within the message.
struct FieldSpan {
  bool present = false;
  int64_t at = 0;
  int64_t length = 0;
};

template <typename Message>
bool ParseSpan(const SliceReader& reader, const FieldSpan& span, Message* message) {
  if (span.length == 0) return message->ParseFromString(std::string());
  if (const char* p = reader.Contiguous(span.at, span.length); p != nullptr) {
    return message->ParseFromArray(p, static_cast<int>(span.length));
  }
  std::string copy(static_cast<size_t>(span.length), '\0');
  reader.CopyOut(span.at, span.length, copy.data());
  return message->ParseFromString(copy);
}

// Splits a Frame message into its fields. Unknown fields are skipped (forward compatibility);
// repeated known fields, groups and wrong wire types are INVALID_ARGUMENT.
absl::Status ScanFrame(SliceReader& reader, FieldSpan* header, FieldSpan* credit,
                       FieldSpan* payload) {
  while (reader.remaining() > 0) {
    const int64_t tag_at = reader.position();
    uint64_t tag;
    if (!reader.ReadVarint(&tag)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Frame: truncated or overlong field tag at byte ", tag_at));
    }
    const uint64_t field = tag >> 3;
    const int wire_type = static_cast<int>(tag & 7);
    if (field == 0 || field > 536870911) {
      return absl::InvalidArgumentError(
          absl::StrCat("Frame: invalid field number ", field, " at byte ", tag_at));
    }
    FieldSpan* known = nullptr;
    const char* name = "";
    if (field == kHeaderField) {
      known = header;
      name = "header";
    } else if (field == kCreditField) {
      known = credit;
      name = "credit";
    } else if (field == kPayloadField) {
      known = payload;
      name = "payload";
    }
    if (known != nullptr && wire_type != 2) {
      return absl::InvalidArgumentError(absl::StrCat("Frame: field '", name, "' at byte ", tag_at,
                                                     " has wire type ", wire_type,
                                                     ", expected 2 (length-delimited)"));
    }
    switch (wire_type) {
      case 0: {
        uint64_t ignored;
        if (!reader.ReadVarint(&ignored)) {
          return absl::InvalidArgumentError(
              absl::StrCat("Frame: truncated varint of field ", field, " at byte ", tag_at));
        }
        break;
      }
      case 1:
      case 5:
        if (!reader.Skip(wire_type == 1 ? 8 : 4)) {
          return absl::InvalidArgumentError(
              absl::StrCat("Frame: truncated fixed-width field ", field, " at byte ", tag_at));
        }
        break;
      case 2: {
        uint64_t length;
        if (!reader.ReadVarint(&length)) {
          return absl::InvalidArgumentError(
              absl::StrCat("Frame: truncated length of field ", field, " at byte ", tag_at));
        }
        const int64_t at = reader.position();
        if (length > static_cast<uint64_t>(reader.remaining())) {
          return absl::InvalidArgumentError(
              absl::StrCat("Frame: field ", field, " at byte ", tag_at, " claims ", length,
                           " bytes but only ", reader.remaining(), " remain"));
        }
        reader.Skip(length);
        if (known != nullptr) {
          if (known->present) {
            return absl::InvalidArgumentError(absl::StrCat(
                "Frame: field '", name, "' appears twice (again at byte ", tag_at, ")"));
          }
          *known = FieldSpan{true, at, static_cast<int64_t>(length)};
        }
        break;
      }
      default:
        return absl::InvalidArgumentError(absl::StrCat("Frame: unsupported wire type ", wire_type,
                                                       " of field ", field, " at byte ", tag_at));
    }
  }
  return absl::OkStatus();
}

std::string Describe(const pb::FrameHeader& h) {
  return absl::StrCat(TensorKindName(static_cast<TensorKind>(h.kind())), "(step=", h.step(),
                      ", mb=", h.microbatch(), ", chunk=", h.chunk(), ")");
}

// Validates everything a header says on its own (not the fragment sequence). On success fills
// `key`, `rows`, `cols`.
absl::Status ValidateHeader(const FrameValidation& v, const pb::FrameHeader& h,
                            int64_t payload_bytes, TensorKey* key, int64_t* rows, int64_t* cols) {
  if (h.job() != v.expected.job) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame for job '", h.job(), "' on a stream of job '", v.expected.job, "'"));
  }
  if (h.generation() != v.expected.generation) {
    return absl::AbortedError(absl::StrCat("stale frame ", Describe(h), ": generation ",
                                           h.generation(), ", the stream of job '", v.expected.job,
                                           "' is at generation ", v.expected.generation));
  }
  const std::string what = absl::StrCat("frame ", Describe(h));
  if (!ValidKind(h.kind())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": unknown tensor kind ", static_cast<int>(h.kind())));
  }
  const TensorKind kind = static_cast<TensorKind>(h.kind());
  if (h.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": negative step"));
  }
  if (h.step() < v.min_step || h.step() > v.max_step) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": step ", h.step(),
                                                      " outside the accepted range [", v.min_step,
                                                      ", ", v.max_step, "]"));
  }
  if (kind == TensorKind::kReplicaGradient) {
    // The micro-batch field of a replica's message is segment * replica_rounds + round.
    if (v.replica_rounds < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": a replica_gradient on a stream of a job without replicas"));
    }
    if (h.microbatch() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": negative segment and round ", h.microbatch()));
    }
  } else if (kind == TensorKind::kCopyGradient) {
    // The micro-batch field of a copy's message is segment * 2 + round (a 2-peer reduction).
    if (h.microbatch() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": negative segment and round ", h.microbatch()));
    }
  } else if (h.microbatch() < 0 || h.microbatch() >= v.num_microbatches) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": micro-batch ", h.microbatch(),
                                                   " outside [0, ", v.num_microbatches, ")"));
  }
  if (h.chunk() < 0 || h.chunk() >= v.num_chunks) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": chunk ", h.chunk(), " outside [0, ", v.num_chunks, ")"));
  }
  const int32_t last_chunk = v.num_chunks - 1;
  // With two copies, the up copy's first chunk and the down copy's last are route ends too.
  const int32_t up_first = v.two_copies ? v.num_chunks / 2 : 0;
  const int32_t down_last = v.two_copies ? v.num_chunks / 2 - 1 : last_chunk;
  bool chunk_fits_kind = true;
  switch (kind) {
    case TensorKind::kActivation:
      chunk_fits_kind = h.chunk() >= 1;  // the input activation of chunk 0 is the input.
      break;
    case TensorKind::kGradient:
      chunk_fits_kind = h.chunk() < last_chunk;  // the last chunk's output feeds the loss.
      break;
    case TensorKind::kInput:
      chunk_fits_kind = h.chunk() == 0 || h.chunk() == up_first;
      break;
    case TensorKind::kTarget:
      chunk_fits_kind = h.chunk() == last_chunk || h.chunk() == down_last;
      break;
    case TensorKind::kTiedGradient:  // for the embedding's or the head's owner.
      chunk_fits_kind = h.chunk() == 0 || h.chunk() == last_chunk;
      break;
    case TensorKind::kReplicaGradient:  // any chunk; the receiver checks that it holds it.
      break;
    case TensorKind::kCopyGradient:  // for the owner of a copy of the stage.
      chunk_fits_kind = v.two_copies;
      break;
  }
  if (!chunk_fits_kind) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": a ", TensorKindName(kind),
                                                   " cannot name chunk ", h.chunk(), " of ",
                                                   v.num_chunks));
  }
  if ((v.allowed_kinds & KindBit(kind)) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", TensorKindName(kind), " frames are not accepted on this stream"));
  }
  if (h.dtype() != pb::DTYPE_F32) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": dtype ", static_cast<int>(h.dtype()), ", only F32 is supported"));
  }
  if (h.shape_size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": shape has rank ", h.shape_size(), ", expected 2"));
  }
  for (int i = 0; i < 2; ++i) {
    if (h.shape(i) <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": shape dimension ", i, " is ", h.shape(i), ", must be > 0"));
    }
    if (h.shape(i) > v.max_dim) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, ": shape dimension ", i, " is ", h.shape(i), ", limit ", v.max_dim));
    }
  }
  const int64_t r = h.shape(0);
  const int64_t c = h.shape(1);
  const int64_t max_elements = v.max_tensor_bytes / static_cast<int64_t>(sizeof(float));
  if (r > max_elements / c) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": tensor [", r, ", ", c, "] exceeds the limit of ", v.max_tensor_bytes, " bytes"));
  }
  const int64_t bytes = r * c * static_cast<int64_t>(sizeof(float));
  if (h.total_bytes() != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": total_bytes ", h.total_bytes(),
                                                   " but shape [", r, ", ", c, "] x 4 = ", bytes));
  }
  if (payload_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": empty payload"));
  }
  if (payload_bytes > v.max_fragment_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": payload of ", payload_bytes,
                                                     " bytes exceeds the fragment limit of ",
                                                     v.max_fragment_bytes));
  }
  if (h.offset() < 0 || h.offset() > bytes - payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": payload [", h.offset(), ", +",
                                                   payload_bytes, ") outside the tensor's ", bytes,
                                                   " bytes"));
  }
  *key = TensorKey{h.step(), h.microbatch(), h.chunk(), kind};
  *rows = r;
  *cols = c;
  return absl::OkStatus();
}

}  // namespace

absl::Status FrameValidation::Check() const {
  if (num_microbatches < 1 || num_chunks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("frame validation: ", num_microbatches,
                                                   " micro-batches and ", num_chunks,
                                                   " chunks, need >= 1 each"));
  }
  if (replica_rounds < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame validation: ", replica_rounds, " replica rounds, need >= 0"));
  }
  if (two_copies && num_chunks % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame validation: two copies of the stages need an even chunk count, got ", num_chunks));
  }
  if (min_step < 0 || max_step < min_step) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame validation: empty step range [", min_step, ", ", max_step, "]"));
  }
  if (max_dim < 1 || max_tensor_bytes < static_cast<int64_t>(sizeof(float)) ||
      max_fragment_bytes < 1) {
    return absl::InvalidArgumentError("frame validation: limits must be positive");
  }
  return absl::OkStatus();
}

int64_t NumFragments(int64_t total_bytes, int64_t fragment_bytes) {
  if (total_bytes <= 0 || fragment_bytes <= 0) return 0;
  return (total_bytes + fragment_bytes - 1) / fragment_bytes;
}

absl::Status EncodeFragment(const StreamIdentity& id, const TensorKey& key,
                            const std::shared_ptr<const math::Matrix>& tensor, int64_t offset,
                            int64_t length, grpc::ByteBuffer* out) {
  PT_RETURN_IF_ERROR(CheckKey(key));
  if (tensor == nullptr || tensor->size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", key.ToString(), " is empty"));
  }
  const int64_t total = static_cast<int64_t>(tensor->size()) * sizeof(float);
  if (length <= 0 || length > kMaxFragmentBytes || offset < 0 || offset > total - length) {
    return absl::InvalidArgumentError(absl::StrCat("fragment [", offset, ", +", length, ") of ",
                                                   key.ToString(), " invalid for ", total,
                                                   " bytes"));
  }
  EnsureGrpcCodegen();

  pb::FrameHeader header;
  header.set_job(id.job);
  header.set_generation(id.generation);
  header.set_step(key.step);
  header.set_microbatch(key.microbatch);
  header.set_chunk(key.chunk);
  header.set_kind(static_cast<pb::TensorKind>(key.kind));
  header.set_dtype(pb::DTYPE_F32);
  header.add_shape(tensor->rows());
  header.add_shape(tensor->cols());
  header.set_total_bytes(total);
  header.set_offset(offset);

  std::string prefix;
  const size_t header_size = header.ByteSizeLong();
  prefix.reserve(header_size + 24);
  prefix.push_back(static_cast<char>(kHeaderTag));
  AppendVarint(header_size, &prefix);
  if (!header.AppendToString(&prefix)) {
    return absl::InternalError(absl::StrCat("cannot serialize the header of ", key.ToString()));
  }
  prefix.push_back(static_cast<char>(kPayloadTag));
  AppendVarint(static_cast<uint64_t>(length), &prefix);

  char* data = reinterpret_cast<char*>(const_cast<float*>(tensor->data())) + offset;
  grpc::Slice slices[2] = {
      grpc::Slice(prefix),
      grpc::Slice(data, static_cast<size_t>(length), &ReleaseTensor,
                  new std::shared_ptr<const math::Matrix>(tensor)),
  };
  grpc::ByteBuffer buffer(slices, 2);
  out->Swap(&buffer);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<grpc::ByteBuffer>> EncodeTensor(
    const StreamIdentity& id, const TensorKey& key,
    const std::shared_ptr<const math::Matrix>& tensor, int64_t fragment_bytes) {
  if (fragment_bytes < 1 || fragment_bytes > kMaxFragmentBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("fragment size ", fragment_bytes, " outside [1, ", kMaxFragmentBytes, "]"));
  }
  if (tensor == nullptr || tensor->size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", key.ToString(), " is empty"));
  }
  const int64_t total = static_cast<int64_t>(tensor->size()) * sizeof(float);
  std::vector<grpc::ByteBuffer> frames(static_cast<size_t>(NumFragments(total, fragment_bytes)));
  int64_t offset = 0;
  for (grpc::ByteBuffer& frame : frames) {
    const int64_t length = std::min(fragment_bytes, total - offset);
    PT_RETURN_IF_ERROR(EncodeFragment(id, key, tensor, offset, length, &frame));
    offset += length;
  }
  return frames;
}

absl::Status EncodeCredit(int64_t bytes, grpc::ByteBuffer* out) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("credit grant of ", bytes, " bytes"));
  }
  EnsureGrpcCodegen();
  pb::Frame frame;
  frame.mutable_credit()->set_bytes(bytes);
  grpc::Slice slice(frame.SerializeAsString());
  grpc::ByteBuffer buffer(&slice, 1);
  out->Swap(&buffer);
  return absl::OkStatus();
}

FrameDecoder::FrameDecoder(FrameValidation validation)
    : validation_(std::move(validation)), validation_status_(validation_.Check()) {}

FrameDecoder::FrameDecoder(FrameValidation validation, std::shared_ptr<TensorReassembler> shared)
    : validation_(std::move(validation)),
      validation_status_(validation_.Check()),
      shared_(std::move(shared)) {}

absl::StatusOr<DecodedFrame> FrameDecoder::Decode(const grpc::ByteBuffer& buffer) {
  PT_RETURN_IF_ERROR(validation_status_);
  EnsureGrpcCodegen();
  std::vector<grpc::Slice> slices;
  if (buffer.Valid() && !buffer.Dump(&slices).ok()) slices.clear();
  SliceReader reader(slices);
  if (reader.size() == 0) {
    assembly_.reset();
    return absl::InvalidArgumentError("Frame: empty message");
  }

  FieldSpan header_span, credit_span, payload_span;
  absl::Status scanned = ScanFrame(reader, &header_span, &credit_span, &payload_span);
  if (!scanned.ok()) {
    assembly_.reset();
    return scanned;
  }

  DecodedFrame decoded;
  if (credit_span.present) {
    if (header_span.present || payload_span.present) {
      assembly_.reset();
      return absl::InvalidArgumentError("Frame: a credit frame carries a header or payload");
    }
    pb::Credit credit;
    if (!ParseSpan(reader, credit_span, &credit)) {
      assembly_.reset();
      return absl::InvalidArgumentError("Frame: malformed credit");
    }
    if (credit.bytes() <= 0) {
      assembly_.reset();
      return absl::InvalidArgumentError(
          absl::StrCat("Frame: credit grant of ", credit.bytes(), " bytes"));
    }
    decoded.type = DecodedFrame::Type::kCredit;
    decoded.credit_bytes = credit.bytes();
    return decoded;
  }
  if (!header_span.present) {
    assembly_.reset();
    return absl::InvalidArgumentError("Frame: neither header nor credit");
  }
  if (header_span.length > kMaxHeaderBytes) {
    assembly_.reset();
    return absl::ResourceExhaustedError(
        absl::StrCat("Frame: header of ", header_span.length, " bytes exceeds ", kMaxHeaderBytes));
  }
  pb::FrameHeader header;
  if (!ParseSpan(reader, header_span, &header)) {
    assembly_.reset();
    return absl::InvalidArgumentError("Frame: malformed header");
  }
  int64_t rows = 0, cols = 0;
  TensorKey key;
  const int64_t length = payload_span.present ? payload_span.length : 0;
  absl::Status valid = ValidateHeader(validation_, header, length, &key, &rows, &cols);
  if (!valid.ok()) {
    assembly_.reset();
    return valid;
  }

  decoded.key = key;
  decoded.payload_bytes = length;
  if (shared_ != nullptr) {
    // A striped link: any offset, any order, any stream; the reassembler refuses overlaps.
    absl::StatusOr<TensorReassembler::Reservation> reserved =
        shared_->Reserve(key, rows, cols, header.offset(), length);
    if (!reserved.ok()) return reserved.status();
    reader.CopyOut(payload_span.at, length, reserved->destination);
    std::optional<TensorReassembler::Completed> completed = shared_->Commit(*std::move(reserved));
    if (completed.has_value()) {
      decoded.type = DecodedFrame::Type::kComplete;
      decoded.tensor = std::move(completed->tensor);
      decoded.first_fragment = completed->first_fragment;
    } else {
      decoded.type = DecodedFrame::Type::kPartial;
    }
    return decoded;
  }
  if (!assembly_.has_value()) {
    if (header.offset() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("frame ", key.ToString(), ": fragment at byte ", header.offset(),
                       " without the preceding fragments (expected byte 0)"));
    }
    Assembly fresh;
    fresh.key = key;
    fresh.total_bytes = header.total_bytes();
    fresh.tensor.resize(rows, cols);
    assembly_ = std::move(fresh);
  } else {
    const Assembly& a = *assembly_;
    if (!(a.key == key) || a.tensor.rows() != rows || a.tensor.cols() != cols) {
      const std::string message =
          absl::StrCat("frame ", key.ToString(), " [", rows, ", ", cols, "] interrupts ",
                       a.key.ToString(), " [", a.tensor.rows(), ", ", a.tensor.cols(), "] after ",
                       a.received_bytes, " of ", a.total_bytes, " bytes");
      assembly_.reset();
      return absl::InvalidArgumentError(message);
    }
    if (header.offset() != a.received_bytes) {
      const std::string message =
          absl::StrCat("frame ", key.ToString(), ": fragment at byte ", header.offset(),
                       ", expected byte ", a.received_bytes, " of ", a.total_bytes);
      assembly_.reset();
      return absl::InvalidArgumentError(message);
    }
  }

  Assembly& a = *assembly_;
  reader.CopyOut(payload_span.at, length,
                 reinterpret_cast<char*>(a.tensor.data()) + a.received_bytes);
  a.received_bytes += length;
  if (a.received_bytes == a.total_bytes) {
    decoded.type = DecodedFrame::Type::kComplete;
    decoded.tensor = std::move(a.tensor);
    assembly_.reset();
  } else {
    decoded.type = DecodedFrame::Type::kPartial;
  }
  return decoded;
}

}  // namespace pipetrain::wire
