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

#include <functional>

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

// The rounds of AllReduceSum over `peers` peers: 2 log2(peers) (0 for one peer), or -1 if
// `peers` is not a power of two >= 1.
int AllReduceRounds(int peers);

// The peer `me` exchanges messages with in round `round` of AllReduceSum over `peers` peers:
// me XOR 2^round in the halving, me XOR 2^(2 log2(peers) - 1 - round) in the doubling; -1 if the
// arguments are outside their ranges. A receiver checks with it who may send a round's message.
int AllReducePartner(int me, int peers, int round);

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_GRADIENT_EXCHANGE_H_
