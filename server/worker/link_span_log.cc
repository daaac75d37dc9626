#include "server/worker/link_span_log.h"

#include <algorithm>
#include <tuple>
#include <utility>

namespace pipetrain::worker {

void LinkSpanLog::SendQueued(const std::string& peer, const wire::TensorKey& key, int64_t bytes,
                             Clock::time_point at) {
  absl::MutexLock lock(&mu_);
  if (entries_.size() >= kMaxEntries) return;
  entries_.push_back(Entry{true, peer, key, bytes, at, std::nullopt});
}

void LinkSpanLog::Record(const std::string& peer, const link::LinkTransfer& transfer) {
  absl::MutexLock lock(&mu_);
  if (transfer.direction == link::LinkTransfer::Direction::kSend) {
    for (Entry& e : entries_) {
      if (e.send && !e.end.has_value() && e.peer == peer && e.key == transfer.key) {
        e.end = std::max(e.start, transfer.end);
        return;
      }
    }
    return;
  }
  if (entries_.size() >= kMaxEntries) return;
  entries_.push_back(Entry{false, peer, transfer.key, transfer.bytes, transfer.start,
                           std::max(transfer.start, transfer.end)});
}

std::vector<LinkSpanTiming> LinkSpanLog::TakeStep(int64_t step, Clock::time_point t0,
                                                  Clock::time_point now) {
  std::vector<LinkSpanTiming> spans;
  {
    absl::MutexLock lock(&mu_);
    std::vector<Entry> later;
    for (Entry& e : entries_) {
      if (e.key.step > step) {
        later.push_back(std::move(e));
        continue;
      }
      if (e.key.step < step) continue;
      const Clock::time_point start = std::max(e.start, t0);
      const Clock::time_point end = std::max(start, e.end.value_or(now));
      spans.push_back(LinkSpanTiming{e.send, std::move(e.peer), e.key, e.bytes,
                                     absl::FromChrono(start - t0), absl::FromChrono(end - t0),
                                     e.end.has_value()});
    }
    entries_ = std::move(later);
  }
  std::sort(spans.begin(), spans.end(), [](const LinkSpanTiming& a, const LinkSpanTiming& b) {
    return std::tie(a.start, b.send, a.peer, a.key) < std::tie(b.start, a.send, b.peer, b.key);
  });
  return spans;
}

void LinkSpanLog::Clear() {
  absl::MutexLock lock(&mu_);
  entries_.clear();
}

}  // namespace pipetrain::worker
