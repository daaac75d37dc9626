#include "server/link/stripe_registry.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/net/token_auth.h"

namespace pipetrain::link::internal {

absl::StatusOr<StripeHello> ParseStripeHello(const std::optional<std::string>& stripe,
                                             const std::optional<std::string>& link_id,
                                             const std::string& from) {
  StripeHello hello;
  if (!stripe.has_value()) {
    if (link_id.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Exchange stream from ", from, ": ", kLinkIdKey, " without ", kStripeKey));
    }
    return hello;
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(*stripe, '/');
  int64_t index = -1;
  int64_t count = -1;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &index) ||
      !absl::SimpleAtoi(parts[1], &count) || count < 1 || index < 0 || index >= count) {
    return absl::InvalidArgumentError(absl::StrCat("Exchange stream from ", from, ": bad ",
                                                   kStripeKey, " '", stripe->substr(0, 64),
                                                   "' (expected I/N with 0 <= I < N)"));
  }
  if (count > kMaxLinkConnections) {
    return absl::ResourceExhaustedError(absl::StrCat("Exchange stream from ", from, ": a link of ",
                                                     count, " connections, more than the limit of ",
                                                     kMaxLinkConnections));
  }
  hello.index = static_cast<int>(index);
  hello.count = static_cast<int>(count);
  if (count > 1) {
    if (!link_id.has_value() || link_id->empty() || link_id->size() > 64) {
      return absl::InvalidArgumentError(absl::StrCat("Exchange stream from ", from, ": stripe ",
                                                     *stripe, " needs a ", kLinkIdKey,
                                                     " of 1-64 bytes"));
    }
    hello.link_id = *link_id;
  }
  return hello;
}

absl::StatusOr<std::shared_ptr<StripeGroup>> AcceptLink(const PeerHello& hello, int stripes,
                                                        const LinkOptions& options,
                                                        const AcceptFn& accept) {
  std::shared_ptr<StripeGroup> group =
      StripeGroup::Create(/*client_side=*/false, hello.peer, options, stripes);
  absl::StatusOr<LinkSettings> settings =
      accept ? accept(hello, std::make_unique<PeerLink>(group))
             : absl::StatusOr<LinkSettings>(
                   absl::FailedPreconditionError("this server accepts no Exchange streams"));
  if (settings.ok() && !settings->callbacks.on_tensor) {
    settings = absl::InternalError("the accept callback returned no on_tensor callback");
  }
  if (settings.ok()) {
    if (absl::Status checked = settings->validation.Check(); !checked.ok()) settings = checked;
  }
  if (!settings.ok()) {
    group->Abandon(settings.status());
    return settings.status();
  }
  const wire::StreamIdentity identity = settings->validation.expected;
  group->Configure(*std::move(settings), identity);
  return group;
}

absl::StatusOr<std::shared_ptr<StripeGroup>> StripeRegistry::Join(const PeerHello& hello,
                                                                  const StripeHello& stripe,
                                                                  const LinkOptions& options,
                                                                  const AcceptFn& accept) {
  if (stripe.count == 1) return AcceptLink(hello, 1, options, accept);
  const std::string what = absl::StrCat("stripe ", stripe.index, "/", stripe.count,
                                        " of a link from '", hello.peer, "'");
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  DropGoneLocked(now);
  auto it = links_.find(stripe.link_id);
  if (it == links_.end()) return RegisterLocked(hello, stripe, options, accept, now, what);
  return JoinLocked(hello, stripe, what, &it->second);
}

void StripeRegistry::DropGoneLocked(absl::Time now) {
  for (auto it = links_.begin(); it != links_.end();) {
    const Entry& e = it->second;
    const bool gone = e.rejected.ok() ? e.group.expired() : now - e.created > absl::Minutes(1);
    if (gone) {
      links_.erase(it++);
    } else {
      ++it;
    }
  }
}

absl::StatusOr<std::shared_ptr<StripeGroup>> StripeRegistry::RegisterLocked(
    const PeerHello& hello, const StripeHello& stripe, const LinkOptions& options,
    const AcceptFn& accept, absl::Time now, const std::string& what) {
  if (links_.size() >= kMaxPendingLinks) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": ", kMaxPendingLinks, " striped links are open already (the limit)"));
  }
  Entry entry;
  entry.hello = hello;
  entry.count = stripe.count;
  entry.arrived.assign(stripe.count, false);
  entry.arrived[stripe.index] = true;
  entry.created = now;
  absl::StatusOr<std::shared_ptr<StripeGroup>> group =
      AcceptLink(hello, stripe.count, options, accept);
  if (group.ok()) {
    entry.group = *group;
  } else {
    entry.rejected = group.status();
  }
  links_.emplace(stripe.link_id, std::move(entry));
  return group;
}

absl::StatusOr<std::shared_ptr<StripeGroup>> StripeRegistry::JoinLocked(const PeerHello& hello,
                                                                        const StripeHello& stripe,
                                                                        const std::string& what,
                                                                        Entry* entry) {
  Entry& e = *entry;
  if (e.count != stripe.count || e.hello.peer != hello.peer ||
      e.hello.identity.job != hello.identity.job ||
      e.hello.identity.generation != hello.identity.generation ||
      !net::ConstantTimeEquals(e.hello.secret, hello.secret)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what,
        ": its hello (peer, job, generation, link secret) or stripe count differs from that of "
        "the link's first stripe"));
  }
  if (!e.rejected.ok()) return e.rejected;
  std::shared_ptr<StripeGroup> group = e.group.lock();
  if (group == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": that link is closed already"));
  }
  if (e.arrived[stripe.index]) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": that stripe arrived already"));
  }
  e.arrived[stripe.index] = true;
  return group;
}

}  // namespace pipetrain::link::internal
