#include "server/worker/gradient_exchange.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/status_macros.h"

namespace pipetrain::worker {

absl::StatusOr<math::Tensor> SumWithPeer(ExchangeTransport* transport, const wire::TensorKey& send,
                                         const wire::TensorKey& receive, const math::Tensor& mine,
                                         bool mine_is_lower) {
  if (mine.shape.size() != 2 || mine.shape[0] < 1 || mine.shape[1] < 1 ||
      static_cast<int64_t>(mine.data.size()) != math::NumElements(mine.shape)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient exchange ", send.ToString(), ": the local part of shape [",
                     absl::StrJoin(mine.shape, ", "), "] with ", mine.data.size(),
                     " floats is not a rank-2 tensor"));
  }
  const int64_t rows = mine.shape[0];
  const int64_t cols = mine.shape[1];
  math::Matrix out(rows, cols);
  std::memcpy(out.data(), mine.data.data(), mine.data.size() * sizeof(float));
  transport->Send(send, std::move(out));
  PT_ASSIGN_OR_RETURN(const math::Matrix theirs, transport->Take(receive));
  if (theirs.rows() != rows || theirs.cols() != cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient exchange: the peer's part ", receive.ToString(), " has shape [", theirs.rows(),
        ", ", theirs.cols(), "], the local part [", rows, ", ", cols, "]"));
  }
  const float* lower = mine_is_lower ? mine.data.data() : theirs.data();
  const float* upper = mine_is_lower ? theirs.data() : mine.data.data();
  math::Tensor sum{mine.shape, std::vector<float>(mine.data.size())};
  for (size_t i = 0; i < sum.data.size(); ++i) sum.data[i] = lower[i] + upper[i];
  return sum;
}

namespace {

// Sends data[lo, hi) to `to` under key(me, to, round) and takes `to`'s message of the same round
// and length into *theirs. Nothing travels for an empty range.
absl::Status SwapRange(ExchangeTransport* transport, const AllReduceKeyFn& key, int me, int to,
                       int round, const float* send, int64_t send_len, int64_t take_len,
                       math::Matrix* theirs) {
  if (send_len > 0) {
    math::Matrix out(1, send_len);
    std::memcpy(out.data(), send, static_cast<size_t>(send_len) * sizeof(float));
    transport->Send(key(me, to, round), std::move(out));
  }
  if (take_len == 0) {
    theirs->resize(0, 0);
    return absl::OkStatus();
  }
  const wire::TensorKey from = key(to, me, round);
  PT_ASSIGN_OR_RETURN(*theirs, transport->Take(from));
  if (theirs->size() != take_len) {
    return absl::InvalidArgumentError(absl::StrCat("allreduce: peer ", to, "'s message ",
                                                   from.ToString(), " holds ", theirs->size(),
                                                   " floats, expected ", take_len));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AllReduceSum(ExchangeTransport* transport, int me, int peers,
                          const AllReduceKeyFn& key, math::Tensor* data) {
  if (peers < 1 || (peers & (peers - 1)) != 0 || me < 0 || me >= peers) {
    return absl::InvalidArgumentError(absl::StrCat("allreduce: ", peers,
                                                   " peers (a power of two is needed) and peer ",
                                                   me, " (must be in [0, peers))"));
  }
  if (static_cast<int64_t>(data->data.size()) != math::NumElements(data->shape)) {
    return absl::InvalidArgumentError(absl::StrCat("allreduce: data of shape [",
                                                   absl::StrJoin(data->shape, ", "), "] holds ",
                                                   data->data.size(), " floats"));
  }
  float* x = data->data.data();
  int rounds = 0;
  while ((1 << rounds) < peers) ++rounds;
  // ranges[r]: this peer's range before round r of the halving; both partners of round r share it.
  std::vector<std::pair<int64_t, int64_t>> ranges;
  int64_t lo = 0, hi = static_cast<int64_t>(data->data.size());
  math::Matrix theirs;
  for (int r = 0; r < rounds; ++r) {
    ranges.emplace_back(lo, hi);
    const int partner = me ^ (1 << r);
    const bool lower = (me & (1 << r)) == 0;
    const int64_t mid = lo + (hi - lo) / 2;
    const int64_t keep_lo = lower ? lo : mid, keep_hi = lower ? mid : hi;
    const int64_t give_lo = lower ? mid : lo, give_hi = lower ? hi : mid;
    PT_RETURN_IF_ERROR(SwapRange(transport, key, me, partner, r, x + give_lo, give_hi - give_lo,
                                 keep_hi - keep_lo, &theirs));
    for (int64_t i = keep_lo; i < keep_hi; ++i) {
      const float t = theirs.data()[i - keep_lo];
      x[i] = lower ? x[i] + t : t + x[i];  // lower peer's partial first.
    }
    lo = keep_lo;
    hi = keep_hi;
  }
  for (int r = rounds - 1; r >= 0; --r) {
    const int partner = me ^ (1 << r);
    const auto [parent_lo, parent_hi] = ranges[r];
    // The partner reduced the other half of the parent range (the halving's split).
    const int64_t mid = parent_lo + (parent_hi - parent_lo) / 2;
    const bool lower = (me & (1 << r)) == 0;
    const int64_t other_lo = lower ? mid : parent_lo, other_hi = lower ? parent_hi : mid;
    PT_RETURN_IF_ERROR(SwapRange(transport, key, me, partner, 2 * rounds - 1 - r, x + lo, hi - lo,
                                 other_hi - other_lo, &theirs));
    if (other_hi > other_lo) {
      std::memcpy(x + other_lo, theirs.data(),
                  static_cast<size_t>(other_hi - other_lo) * sizeof(float));
    }
    lo = parent_lo;
    hi = parent_hi;
  }
  return absl::OkStatus();
}

int AllReduceRounds(int peers) {
  if (peers < 1 || (peers & (peers - 1)) != 0) return -1;
  int rounds = 0;
  while ((1 << rounds) < peers) ++rounds;
  return 2 * rounds;
}

int AllReducePartner(int me, int peers, int round) {
  const int rounds = AllReduceRounds(peers);
  if (rounds < 0 || me < 0 || me >= peers || round < 0 || round >= rounds) return -1;
  const int half = rounds / 2;
  return me ^ (1 << (round < half ? round : rounds - 1 - round));
}

}  // namespace pipetrain::worker
