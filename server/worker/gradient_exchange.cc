#include "server/worker/gradient_exchange.h"

#include <cstring>
#include <tuple>
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

absl::StatusOr<AllReduceState> AllReduceState::Create(int me, int peers, float* data, int64_t n) {
  const int rounds = AllReduceRounds(peers);
  if (rounds < 0 || me < 0 || me >= peers) {
    return absl::InvalidArgumentError(absl::StrCat("allreduce: ", peers,
                                                   " peers (a power of two is needed) and peer ",
                                                   me, " (must be in [0, peers))"));
  }
  if (n < 0 || (n > 0 && data == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("allreduce: no data for ", n, " floats"));
  }
  return AllReduceState(me, rounds, data, n);
}

AllReduceState::AllReduceState(int me, int rounds, float* data, int64_t n)
    : me_(me), rounds_(rounds), data_(data), hi_(n) {
  ranges_.resize(static_cast<size_t>(rounds / 2));
  PlanRound();
}

int AllReduceState::partner() const {
  const int half = rounds_ / 2;
  return me_ ^ (1 << (round_ < half ? round_ : rounds_ - 1 - round_));
}

void AllReduceState::PlanRound() {
  if (done()) return;
  const int half = rounds_ / 2;
  const int bit = round_ < half ? round_ : rounds_ - 1 - round_;
  lower_ = (me_ & (1 << bit)) == 0;
  if (round_ < half) {
    // Halving: keep one half of the current range, give the partner the other.
    ranges_[bit] = {lo_, hi_};
    const int64_t mid = lo_ + (hi_ - lo_) / 2;
    recv_lo_ = lower_ ? lo_ : mid;
    recv_hi_ = lower_ ? mid : hi_;
    send_lo_ = lower_ ? mid : lo_;
    send_hi_ = lower_ ? hi_ : mid;
  } else {
    // Doubling: send the reduced range, take the half of the parent the partner reduced.
    const auto [parent_lo, parent_hi] = ranges_[bit];
    const int64_t mid = parent_lo + (parent_hi - parent_lo) / 2;
    send_lo_ = lo_;
    send_hi_ = hi_;
    recv_lo_ = lower_ ? mid : parent_lo;
    recv_hi_ = lower_ ? parent_hi : mid;
  }
}

absl::Status AllReduceState::Receive(const float* theirs, int64_t len) {
  if (done() || len != receive_len()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allreduce round ", round_, ": the partner's message holds ", len, " floats, expected ",
        done() ? 0 : receive_len(), done() ? " (the reduction is done)" : ""));
  }
  const int half = rounds_ / 2;
  float* x = data_;
  if (round_ < half) {
    for (int64_t i = recv_lo_; i < recv_hi_; ++i) {
      const float t = theirs[i - recv_lo_];
      x[i] = lower_ ? x[i] + t : t + x[i];  // lower peer's partial first.
    }
    lo_ = recv_lo_;
    hi_ = recv_hi_;
  } else {
    if (len > 0) std::memcpy(x + recv_lo_, theirs, static_cast<size_t>(len) * sizeof(float));
    std::tie(lo_, hi_) = ranges_[rounds_ - 1 - round_];
  }
  ++round_;
  PlanRound();
  return absl::OkStatus();
}

absl::Status AllReduceSum(ExchangeTransport* transport, int me, int peers,
                          const AllReduceKeyFn& key, math::Tensor* data) {
  if (static_cast<int64_t>(data->data.size()) != math::NumElements(data->shape)) {
    return absl::InvalidArgumentError(absl::StrCat("allreduce: data of shape [",
                                                   absl::StrJoin(data->shape, ", "), "] holds ",
                                                   data->data.size(), " floats"));
  }
  PT_ASSIGN_OR_RETURN(AllReduceState state,
                      AllReduceState::Create(me, peers, data->data.data(),
                                             static_cast<int64_t>(data->data.size())));
  while (!state.done()) {
    const int to = state.partner();
    const int round = state.round();
    if (state.send_len() > 0) {
      math::Matrix out(1, state.send_len());
      std::memcpy(out.data(), state.send_data(),
                  static_cast<size_t>(state.send_len()) * sizeof(float));
      transport->Send(key(me, to, round), std::move(out));
    }
    if (state.receive_len() == 0) {
      PT_RETURN_IF_ERROR(state.Receive(nullptr, 0));
      continue;
    }
    const wire::TensorKey from = key(to, me, round);
    PT_ASSIGN_OR_RETURN(const math::Matrix theirs, transport->Take(from));
    if (theirs.size() != state.receive_len()) {
      return absl::InvalidArgumentError(absl::StrCat("allreduce: peer ", to, "'s message ",
                                                     from.ToString(), " holds ", theirs.size(),
                                                     " floats, expected ", state.receive_len()));
    }
    PT_RETURN_IF_ERROR(state.Receive(theirs.data(), theirs.size()));
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
