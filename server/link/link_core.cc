#include "server/link/link_core.h"

#include <vector>

namespace pipetrain::link::internal {
namespace {

// Channels that could not be released safely (see ~PeerLink).
absl::Mutex g_kept_channels_mu(absl::kConstInit);
std::vector<std::shared_ptr<grpc::Channel>>* g_kept_channels ABSL_GUARDED_BY(g_kept_channels_mu) =
    nullptr;

}  // namespace

thread_local const void* tls_callback_link = nullptr;

bool InLinkCallback() { return tls_callback_link != nullptr; }

void KeepForever(std::shared_ptr<grpc::Channel> channel) {
  if (channel == nullptr) return;
  absl::MutexLock lock(&g_kept_channels_mu);
  if (g_kept_channels == nullptr) g_kept_channels = new std::vector<std::shared_ptr<grpc::Channel>>;
  g_kept_channels->push_back(std::move(channel));
}

bool ValidKey(const wire::TensorKey& key) {
  const int kind = static_cast<int>(key.kind);
  return kind >= static_cast<int>(wire::TensorKind::kActivation) &&
         kind <= static_cast<int>(wire::TensorKind::kTarget) && key.step >= 0 &&
         key.microbatch >= 0 && key.chunk >= 0;
}

}  // namespace pipetrain::link::internal
