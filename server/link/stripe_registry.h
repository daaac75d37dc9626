// StripeRegistry: the accepting side's half of the stripe handshake (docs/wire.md §5,
// "Striping"). The dialler of a striped link opens one Exchange stream per connection, each
// announcing in call metadata `pipetrain-stripe: I/N` (this stream is stripe I of N) and
// `pipetrain-link-id-bin` (the same random id on every stripe of one link). Streams without them
// are one-stripe links, as before striping existed.
//
// The first stripe of a link to arrive (any index) creates the StripeGroup and offers it, as one
// PeerLink, to the server's AcceptFn; the others join that group. Each stripe must repeat the
// first one's hello (peer, job, generation, link secret) and count, and each index may arrive once.
#ifndef PIPETRAIN_SERVER_LINK_STRIPE_REGISTRY_H_
#define PIPETRAIN_SERVER_LINK_STRIPE_REGISTRY_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/link/peer_link.h"
#include "server/link/stripe_group.h"

namespace pipetrain::link::internal {

// Call metadata of the stripe handshake.
inline constexpr char kStripeKey[] = "pipetrain-stripe";       // "I/N", decimal.
inline constexpr char kLinkIdKey[] = "pipetrain-link-id-bin";  // 1-64 bytes.

// Which stripe of which link a stream is.
struct StripeHello {
  int index = 0;
  int count = 1;
  std::string link_id;  // empty for a one-stripe link.
};

// Parses the handshake metadata of a stream from `from` (for messages); both absent: stripe 0 of
// 1. Errors: a count above kMaxLinkConnections is RESOURCE_EXHAUSTED; anything else malformed
// (not "I/N", N < 1, I outside [0, N), N > 1 without a link id of 1-64 bytes, a link id without a
// stripe) is INVALID_ARGUMENT.
absl::StatusOr<StripeHello> ParseStripeHello(const std::optional<std::string>& stripe,
                                             const std::optional<std::string>& link_id,
                                             const std::string& from);

// Thread-safe. One per ExchangeService.
class StripeRegistry {
 public:
  StripeRegistry() = default;
  StripeRegistry(const StripeRegistry&) = delete;
  StripeRegistry& operator=(const StripeRegistry&) = delete;

  // The group whose stripe `stripe.index` the stream is, configured and ready to start that
  // stripe; or the error to finish the stream with: the AcceptFn's rejection (also for later
  // stripes of a rejected link), INVALID_ARGUMENT for a stripe whose hello or count differs from
  // its link's first stripe or for invalid accepted settings, FAILED_PRECONDITION for a stripe
  // index that already arrived or a link already closed, RESOURCE_EXHAUSTED when
  // kMaxPendingLinks striped links are registered. Calls `accept` (which must not block) at most
  // once per link.
  absl::StatusOr<std::shared_ptr<StripeGroup>> Join(const PeerHello& hello,
                                                    const StripeHello& stripe,
                                                    const LinkOptions& options,
                                                    const AcceptFn& accept);

  // Striped links registered at once (live ones, and rejected ones for a minute).
  static constexpr int kMaxPendingLinks = 1024;

 private:
  struct Entry {
    PeerHello hello;
    int count = 0;
    std::weak_ptr<StripeGroup> group;
    absl::Status rejected;  // non-OK: the AcceptFn refused the link.
    std::vector<bool> arrived;
    absl::Time created;
  };

  // Steps of Join, under mu_.
  // Forgets the links that are closed, and the rejected ones registered over a minute before
  // `now`.
  void DropGoneLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first stripe of a link: offers it to `accept` (AcceptLink) and registers the outcome,
  // accepted or rejected, for its later stripes. RESOURCE_EXHAUSTED when kMaxPendingLinks links
  // are registered. `what` names the stripe for messages.
  absl::StatusOr<std::shared_ptr<StripeGroup>> RegisterLocked(
      const PeerHello& hello, const StripeHello& stripe, const LinkOptions& options,
      const AcceptFn& accept, absl::Time now, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A later stripe of the link registered as `*entry` (an element of links_): its group, once
  // its hello and count match the first stripe's and its index is new; Join's errors otherwise.
  absl::StatusOr<std::shared_ptr<StripeGroup>> JoinLocked(const PeerHello& hello,
                                                          const StripeHello& stripe,
                                                          const std::string& what, Entry* entry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Protects the table of striped links (held while the AcceptFn runs, so that a link's later
  // stripes find it accepted or rejected).
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> links_ ABSL_GUARDED_BY(mu_);
};

// Offers a new link (a group of `stripe.count` stripes) to `accept` and configures it with the
// settings it returns; the error to finish the stream with otherwise.
absl::StatusOr<std::shared_ptr<StripeGroup>> AcceptLink(const PeerHello& hello, int stripes,
                                                        const LinkOptions& options,
                                                        const AcceptFn& accept);

}  // namespace pipetrain::link::internal

#endif  // PIPETRAIN_SERVER_LINK_STRIPE_REGISTRY_H_
