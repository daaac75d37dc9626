// TensorReassembler: puts tensors back together from fragments that arrive in any order, over
// several streams of one striped link (docs/wire.md §5, "Striping").
//
// A fragment is reserved first (its byte range is checked against the tensor's shape and against
// the bytes already reserved, under a lock), then its payload is copied into the reserved bytes
// without the lock (so stripes copy in parallel), then committed. The commit that completes a
// tensor returns it: each tensor is handed out exactly once, whatever order its fragments came in.
#ifndef PIPETRAIN_COMMON_WIRE_TENSOR_REASSEMBLER_H_
#define PIPETRAIN_COMMON_WIRE_TENSOR_REASSEMBLER_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/math/tensor.h"
#include "common/wire/tensor_key.h"

namespace pipetrain::wire {

class TensorReassembler {
 public:
  using Clock = std::chrono::steady_clock;

  // One tensor under reassembly (opaque to callers).
  struct Assembly;

  // Bytes of one fragment reserved for copying: write exactly `length` bytes to `destination`,
  // then pass the reservation to Commit(). Keeps the tensor alive until committed.
  struct Reservation {
    std::shared_ptr<Assembly> assembly;
    char* destination = nullptr;
    int64_t length = 0;
  };

  // A tensor whose last byte was committed.
  struct Completed {
    TensorKey key;
    math::Matrix tensor;
    Clock::time_point first_fragment;  // when its first fragment was reserved.
  };

  // `max_open` (>= 1): most tensors under reassembly at once; a fragment that would start one
  // more is refused (RESOURCE_EXHAUSTED).
  explicit TensorReassembler(int64_t max_open);

  TensorReassembler(const TensorReassembler&) = delete;
  TensorReassembler& operator=(const TensorReassembler&) = delete;

  // Reserves bytes [offset, offset + length) of tensor `key` of shape [rows, cols] (float32,
  // total rows * cols * 4 bytes; the caller has validated shape, offset and length against each
  // other). The first fragment of a key allocates the tensor. Errors: INVALID_ARGUMENT if `key` is
  // under reassembly with another shape, or the range overlaps bytes already reserved;
  // RESOURCE_EXHAUSTED if max_open tensors are already open. Thread-safe.
  absl::StatusOr<Reservation> Reserve(const TensorKey& key, int64_t rows, int64_t cols,
                                      int64_t offset, int64_t length);

  // Marks a reservation's bytes as received. Returns the tensor once all its bytes are (exactly
  // once per tensor), else nothing. Thread-safe.
  std::optional<Completed> Commit(Reservation reservation);

  // Tensors under reassembly right now. Thread-safe.
  int64_t open() const;

 private:
  const int64_t max_open_;
  // Protects the table of open tensors and each Assembly's ranges and counters (not the tensor
  // data: reserved ranges are disjoint and written by their reserver only).
  mutable absl::Mutex mu_;
  absl::flat_hash_map<TensorKey, std::shared_ptr<Assembly>> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain::wire

#endif  // PIPETRAIN_COMMON_WIRE_TENSOR_REASSEMBLER_H_
