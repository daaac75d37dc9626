// StripeGroup: one PeerLink over one or more Exchange streams ("stripes"), each on its own
// HTTP/2 connection (docs/wire.md §5, "Striping").
//
// Sending: a tensor below LinkOptions::stripe_min_bytes, or any tensor of a one-stripe link, goes
// whole on stripe 0, exactly as an unstriped link sends it. A larger tensor is cut into
// contiguous blocks, one per stripe but none below MinStripeBlockBytes(options) (so a 1 MiB
// tensor stays whole, a 2 MiB one takes two stripes), and each stripe sends its block as
// consecutive fragments; at most kMaxOpenStripedTensors striped tensors are being written at
// once (later ones wait, in order).
// Receiving: every stripe decodes into one shared wire::TensorReassembler, so a tensor is
// delivered once, bit-exact, by the stripe that brings its last byte. Credit stays per stripe.
// Failure: the first stripe that fails fails the link: the others are shut down and on_error is
// called once with that stripe's status (a lost connection: UNAVAILABLE, as for one stream).
#ifndef PIPETRAIN_SERVER_LINK_STRIPE_GROUP_H_
#define PIPETRAIN_SERVER_LINK_STRIPE_GROUP_H_

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/wire/tensor_reassembler.h"
#include "server/link/link_core.h"
#include "server/link/peer_link.h"

namespace pipetrain::link::internal {

// Striped tensors a sender writes at once (see the file comment). With 4, a new tensor often
// waited for the slowest stripe's block and the stripes ran in lock-step: stream_bench's split
// rows rose from 0.44-0.55 to 0.65-0.69 of raw TCP at 4 MiB with 16 (docs/performance.md).
inline constexpr int kMaxOpenStripedTensors = 16;

// The smallest block a sender cuts: 1 MiB (wire::kMinFragmentBytes), or stripe_min_bytes if
// that is smaller (tests split tiny tensors; the bound below then does not hold by construction).
int64_t MinStripeBlockBytes(const LinkOptions& options);

// Tensors a receiver with `options` reassembles at once on a link of `stripes` stripes:
// kMaxOpenStripedTensors being written, plus, per stripe, what its credit window can hold of
// blocks written but not yet read (window / 1 MiB) and two partly read or written. A sender with
// blocks of at least 1 MiB stays within it by construction; a peer that opens more tensors is
// refused (RESOURCE_EXHAUSTED) and the link fails.
int64_t MaxOpenTensors(const LinkOptions& options, int stripes);

class StripeGroup : public std::enable_shared_from_this<StripeGroup> {
 public:
  // `stripes` in [1, kMaxLinkConnections] (checked by the callers). Creates the stripes' cores.
  static std::shared_ptr<StripeGroup> Create(bool client_side, std::string peer,
                                             const LinkOptions& options, int stripes);

  StripeGroup(const StripeGroup&) = delete;
  StripeGroup& operator=(const StripeGroup&) = delete;

  // Installs what to receive with and the identity to send under, on every stripe. Once, before
  // any stripe starts.
  void Configure(LinkSettings settings, const wire::StreamIdentity& send_identity);

  int stripes() const { return static_cast<int>(cores_.size()); }
  const std::shared_ptr<LinkCore>& stripe(int i) const { return cores_[i]; }
  const std::string& peer() const { return cores_[0]->peer(); }
  bool client_side() const { return cores_[0]->client_side(); }

  // Closes every stripe of a link that was rejected before it started.
  void Abandon(const absl::Status& status);

  // PeerLink's methods (see peer_link.h).
  absl::Status Send(const wire::TensorKey& key, std::shared_ptr<const math::Matrix> tensor);
  void Shutdown();
  LinkStats stats() const;
  bool WaitFor(const std::function<bool(const LinkStats&)>& condition,
               absl::Duration timeout) const;
  absl::Status status() const;

 private:
  // A striped tensor being written: blocks not yet completely written.
  struct Progress {
    int remaining = 0;
    int64_t bytes = 0;
    std::chrono::steady_clock::time_point start;
  };
  // A striped tensor waiting for its turn.
  struct Waiting {
    wire::TensorKey key;
    std::shared_ptr<const math::Matrix> tensor;
  };

  explicit StripeGroup(std::vector<std::shared_ptr<LinkCore>> cores, const LinkOptions& options);

  // The number of blocks a tensor of `elements` floats is cut into (1: sent whole).
  int BlocksFor(int64_t elements) const;
  // Records a striped tensor as being written (before its blocks are queued).
  void StartLocked(const wire::TensorKey& key, const math::Matrix& tensor)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues the blocks of a striped tensor recorded by StartLocked, one per stripe.
  absl::Status SendBlocks(const wire::TensorKey& key,
                          const std::shared_ptr<const math::Matrix>& tensor);
  // Stripe callbacks (on gRPC threads).
  void OnStripeError(const absl::Status& status);
  void OnStripeTransfer(const LinkTransfer& transfer);

  // Constant after construction (cores_), or after Configure (callbacks_).
  const std::vector<std::shared_ptr<LinkCore>> cores_;
  const LinkOptions options_;
  std::shared_ptr<const LinkCallbacks> callbacks_;

  // Protects the link-level failure, the striped tensors in progress and the waiting ones.
  mutable absl::Mutex mu_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::multimap<wire::TensorKey, Progress> in_progress_ ABSL_GUARDED_BY(mu_);
  std::deque<Waiting> waiting_ ABSL_GUARDED_BY(mu_);
  int64_t striped_sent_ ABSL_GUARDED_BY(mu_) = 0;  // striped tensors completely written.
  int next_whole_ ABSL_GUARDED_BY(mu_) = 0;  // the stripe of the next whole tensor (round robin).
};

}  // namespace pipetrain::link::internal

#endif  // PIPETRAIN_SERVER_LINK_STRIPE_GROUP_H_
