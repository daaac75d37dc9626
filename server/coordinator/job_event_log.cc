#include "server/coordinator/job_event_log.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pipetrain::coordinator {

int64_t JobEventLog::Append(v1::JobEvent event, absl::Time now) {
  event.set_sequence(++last_);
  event.set_unix_ms(absl::ToUnixMillis(now));
  events_.push_back(std::move(event));
  if (events_.size() > capacity_) events_.pop_front();
  for (auto& [id, watch] : watches_) {
    if (!watch.waiting) continue;
    std::optional<v1::JobEvent> next = After(watch.position);
    if (!next.has_value()) continue;
    watch.waiting = false;
    watch.position = next->sequence();
    watch.watcher->OnJobEvent(*std::move(next));
  }
  return last_;
}

std::optional<v1::JobEvent> JobEventLog::After(int64_t position) const {
  if (position >= last_) return std::nullopt;
  const int64_t first_kept = last_ - static_cast<int64_t>(events_.size()) + 1;
  if (position + 1 < first_kept) {
    // The events from position + 1 to first_kept - 1 were dropped before this watch read them.
    v1::JobEvent marker;
    marker.set_sequence(first_kept - 1);
    marker.set_unix_ms(events_.front().unix_ms());
    marker.mutable_skipped()->set_count(first_kept - 1 - position);
    return marker;
  }
  return events_[static_cast<size_t>(position + 1 - first_kept)];
}

absl::StatusOr<int64_t> JobEventLog::AddWatch(JobWatcher* watcher, int64_t after,
                                              size_t max_watches) {
  if (watches_.size() >= max_watches) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the job has ", watches_.size(), " watches open, the most it takes"));
  }
  int64_t position = std::clamp<int64_t>(after, 0, last_);
  if (!events_.empty() && events_.back().has_ended()) position = std::min(position, last_ - 1);
  const int64_t id = next_watch_++;
  watches_[id] = Watch{watcher, position, /*waiting=*/false};
  return id;
}

absl::StatusOr<std::optional<v1::JobEvent>> JobEventLog::Next(int64_t id) {
  auto it = watches_.find(id);
  if (it == watches_.end()) return absl::NotFoundError(absl::StrCat("no watch ", id));
  Watch& watch = it->second;
  std::optional<v1::JobEvent> next = After(watch.position);
  if (next.has_value()) {
    watch.position = next->sequence();
  } else {
    watch.waiting = true;
  }
  return next;
}

void JobEventLog::RemoveWatch(int64_t id) { watches_.erase(id); }

void JobEventLog::CloseWatches(const absl::Status& why) {
  std::map<int64_t, Watch> closing;
  closing.swap(watches_);
  for (auto& [id, watch] : closing) watch.watcher->OnWatchClosed(why);
}

}  // namespace pipetrain::coordinator
