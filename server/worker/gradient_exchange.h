// A worker-to-worker gradient exchange on the data plane: two workers swap their parts of one
// gradient tensor and both form the same sum, bit for bit. docs/wire.md, "Gradient exchange".
//
// The exchange has no transport of its own: its tensors travel as frames of their own kind
// (wire::TensorKind::kTiedGradient) on the Exchange streams the workers already hold -- with
// their mTLS, the generation's link secret, generation fencing (a frame of another generation is
// ABORTED), credit flow control and fragmentation -- and arrive through the worker's Mailbox
// like every other tensor. A lost peer breaks its stream, which aborts the mailbox with the
// link's status (UNAVAILABLE for an unreachable peer): the exchange, and with it the step, fails
// with that status and the job's recovery takes over.
//
// The first user is the tied embedding (model/tied_embedding.h): the ranks holding the embedding
// and the head swap their parts after the step's last weight gradient. The sum is always
// lower + upper (the part of the lower-ranked end first), the combine order that a reduction over
// 2^k data-parallel replicas extends as the binary tree of their indices.
#ifndef PIPETRAIN_SERVER_WORKER_GRADIENT_EXCHANGE_H_
#define PIPETRAIN_SERVER_WORKER_GRADIENT_EXCHANGE_H_

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/math/tensor.h"
#include "common/wire/tensor_key.h"

namespace pipetrain::worker {

// How an exchange reaches its peer: tensors by key, as the executor's Sender and Mailbox move
// them. Implementations must not block in Send.
class ExchangeTransport {
 public:
  virtual ~ExchangeTransport() = default;
  // Queues `tensor` for the worker that owns key.chunk.
  virtual void Send(const wire::TensorKey& key, math::Matrix tensor) = 0;
  // Waits for the tensor of `key` from a peer. Errors: the transport's (the mailbox's abort
  // status, DEADLINE_EXCEEDED naming the key).
  virtual absl::StatusOr<math::Matrix> Take(const wire::TensorKey& key) = 0;
};

// Sends `mine` (a [rows, cols] tensor, rank 2) under `send`, takes the peer's part under
// `receive`, and returns lower + upper element by element, where lower is `mine` when
// `mine_is_lower` and the peer's part otherwise: both peers compute the same bits. Errors:
// INVALID_ARGUMENT if `mine` is not rank 2 or its data does not fill its shape, or if the peer's
// part has another shape (naming both shapes and the key); the transport's errors otherwise.
absl::StatusOr<math::Tensor> SumWithPeer(ExchangeTransport* transport, const wire::TensorKey& send,
                                         const wire::TensorKey& receive, const math::Tensor& mine,
                                         bool mine_is_lower);

// Where the messages of an allreduce go: the key under which peer `from` sends peer `to` its
// message of round `round` (0 <= round < 2 log2(peers)). The transport must deliver a key to peer
// `to`, and keys must differ for different (from, to, round).
using AllReduceKeyFn = std::function<wire::TensorKey(int from, int to, int round)>;

// Sums `*data` over `peers` peers (a power of two, >= 1; this is peer `me`) in place: recursive
// halving (a reduce-scatter: round r pairs peer i with i XOR 2^r, each keeping half of its
// current range) then recursive doubling (an all-gather of the reduced ranges, in reverse). Every
// element is combined as the binary tree of peer indices, lower then upper at every node:
// ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)) -- on every peer the same bits, whatever the
// peer count's history, and with 2 peers exactly SumWithPeer's sum. Each peer sends and receives
// about 2 (peers - 1) / peers of the tensor in 2 log2(peers) messages ([1, len] row vectors; an
// empty range sends nothing). `*data` must have the same shape on every peer. Errors:
// INVALID_ARGUMENT for peers not a power of two, `me` outside [0, peers), data that does not fill
// its shape, or a peer's message of another length (naming the key and both lengths); the
// transport's errors (a lost peer: the link's status). On error `*data` is unspecified.
absl::Status AllReduceSum(ExchangeTransport* transport, int me, int peers,
                          const AllReduceKeyFn& key, math::Tensor* data);

// AllReduceSum as a state machine, for a caller that interleaves several reductions (the
// reducer's segments, replica_reducer.h): round by round, this peer sends send_len() floats from
// send_data() to partner() (nothing when 0), then hands the partner's message of receive_len()
// floats to Receive() (none when 0: Receive(nullptr, 0)), until done(). Same sums, bit for bit,
// as AllReduceSum, which runs it. Not thread-safe; `data` must outlive it, and the range a
// message was sent from must stay unchanged until the peer's reply of that round arrived.
class AllReduceState {
 public:
  // Begins the sum of data[0, n) over `peers` peers as peer `me`. INVALID_ARGUMENT for peers not
  // a power of two >= 1, `me` outside [0, peers), n < 0 or null data with n > 0.
  static absl::StatusOr<AllReduceState> Create(int me, int peers, float* data, int64_t n);

  bool done() const { return round_ == rounds_; }
  // The current round, in [0, 2 log2(peers)]; 2 log2(peers) once done.
  int round() const { return round_; }
  // The peer of the current round (AllReducePartner). Not once done.
  int partner() const;
  // What this peer sends in the current round: data[send_lo, send_lo + send_len).
  const float* send_data() const { return data_ + send_lo_; }
  int64_t send_len() const { return send_hi_ - send_lo_; }
  // The length of the partner's message of the current round.
  int64_t receive_len() const { return recv_hi_ - recv_lo_; }
  // Ends the current round with the partner's message `theirs` of `len` floats (the halving adds
  // it to the kept range, the lower peer's partial first; the doubling copies it in) and moves
  // on. INVALID_ARGUMENT (data unchanged) if len != receive_len() or the state is done.
  absl::Status Receive(const float* theirs, int64_t len);

 private:
  AllReduceState(int me, int rounds, float* data, int64_t n);
  // Sets the send and receive ranges of round_.
  void PlanRound();

  int me_ = 0;
  int rounds_ = 0;  // 2 log2(peers).
  float* data_ = nullptr;
  int round_ = 0;
  int64_t lo_ = 0, hi_ = 0;  // the range this peer holds the partial sum of.
  // ranges_[b]: the range before the halving's round b (its parent in the doubling).
  std::vector<std::pair<int64_t, int64_t>> ranges_;
  int64_t send_lo_ = 0, send_hi_ = 0, recv_lo_ = 0, recv_hi_ = 0;
  bool lower_ = true;  // this peer is the lower of the round's pair.
};

// The rounds of AllReduceSum over `peers` peers: 2 log2(peers) (0 for one peer), or -1 if
// `peers` is not a power of two >= 1.
int AllReduceRounds(int peers);

// The peer `me` exchanges messages with in round `round` of AllReduceSum over `peers` peers:
// me XOR 2^round in the halving, me XOR 2^(2 log2(peers) - 1 - round) in the doubling; -1 if the
// arguments are outside their ranges. A receiver checks with it who may send a round's message.
int AllReducePartner(int me, int peers, int round);

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_GRADIENT_EXCHANGE_H_
