#include "common/wire/tensor_reassembler.h"

#include <iterator>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pipetrain::wire {

struct TensorReassembler::Assembly {
  TensorKey key;
  int64_t total_bytes = 0;
  int64_t committed_bytes = 0;          // guarded by the reassembler's mu_.
  std::map<int64_t, int64_t> reserved;  // start -> end, disjoint, adjacent ones merged (mu_).
  Clock::time_point first_fragment;
  math::Matrix tensor;  // its bytes are written by the reservation holders, without mu_.
};

TensorReassembler::TensorReassembler(int64_t max_open) : max_open_(max_open < 1 ? 1 : max_open) {}

absl::StatusOr<TensorReassembler::Reservation> TensorReassembler::Reserve(
    const TensorKey& key, int64_t rows, int64_t cols, int64_t offset, int64_t length) {
  const int64_t total = rows * cols * static_cast<int64_t>(sizeof(float));
  if (rows <= 0 || cols <= 0 || length <= 0 || offset < 0 || offset > total - length) {
    return absl::InvalidArgumentError(absl::StrCat("fragment [", offset, ", +", length, ") of ",
                                                   key.ToString(), " [", rows, ", ", cols,
                                                   "] lies outside its ", total, " bytes"));
  }
  absl::MutexLock lock(&mu_);
  std::shared_ptr<Assembly>& slot = open_[key];
  if (slot == nullptr) {
    if (static_cast<int64_t>(open_.size()) > max_open_) {
      open_.erase(key);
      return absl::ResourceExhaustedError(
          absl::StrCat("fragment of ", key.ToString(), " would open one more tensor than the ",
                       max_open_, " a striped link may reassemble at once"));
    }
    slot = std::make_shared<Assembly>();
    slot->key = key;
    slot->total_bytes = total;
    slot->first_fragment = Clock::now();
    slot->tensor.resize(rows, cols);
  } else if (slot->tensor.rows() != rows || slot->tensor.cols() != cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("fragment of ", key.ToString(), " [", rows, ", ", cols,
                     "] while that tensor is being "
                     "reassembled as [",
                     slot->tensor.rows(), ", ", slot->tensor.cols(), "]"));
  }
  Assembly& a = *slot;
  const int64_t end = offset + length;
  auto next = a.reserved.upper_bound(offset);  // first range starting after `offset`.
  const bool overlaps_next = next != a.reserved.end() && next->first < end;
  const bool overlaps_previous = next != a.reserved.begin() && std::prev(next)->second > offset;
  if (overlaps_next || overlaps_previous) {
    return absl::InvalidArgumentError(absl::StrCat("fragment [", offset, ", +", length, ") of ",
                                                   key.ToString(),
                                                   " overlaps bytes already received"));
  }
  // Insert [offset, end), merged with adjacent ranges so the map stays small.
  int64_t start = offset;
  int64_t stop = end;
  if (next != a.reserved.begin() && std::prev(next)->second == offset) {
    auto previous = std::prev(next);
    start = previous->first;
    a.reserved.erase(previous);
  }
  if (next != a.reserved.end() && next->first == end) {
    stop = next->second;
    a.reserved.erase(next);
  }
  a.reserved.emplace(start, stop);
  return Reservation{slot, reinterpret_cast<char*>(a.tensor.data()) + offset, length};
}

std::optional<TensorReassembler::Completed> TensorReassembler::Commit(Reservation reservation) {
  if (reservation.assembly == nullptr) return std::nullopt;
  Assembly& a = *reservation.assembly;
  absl::MutexLock lock(&mu_);
  a.committed_bytes += reservation.length;
  if (a.committed_bytes != a.total_bytes) return std::nullopt;
  auto it = open_.find(a.key);
  if (it != open_.end() && it->second == reservation.assembly) open_.erase(it);
  return Completed{a.key, std::move(a.tensor), a.first_fragment};
}

int64_t TensorReassembler::open() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(open_.size());
}

}  // namespace pipetrain::wire
