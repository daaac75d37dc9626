#include "server/coordinator/worker_registry.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/partition/partitioner.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/coordinator/job_isa.h"

namespace pipetrain::coordinator {

absl::Status WorkerRegistry::CheckRegistration(const v1::RegisterWorker& r) {
  if (r.name().empty()) return absl::InvalidArgumentError("RegisterWorker: empty name");
  const std::string who = absl::StrCat("RegisterWorker '", r.name(), "': ");
  if (r.address().empty()) return absl::InvalidArgumentError(absl::StrCat(who, "empty address"));
  // The partitioner's range: a worker whose speed it would refuse cannot take a rank.
  if (!(r.gflops() >= partition::kMinSpeed && r.gflops() <= partition::kMaxSpeed)) {
    return absl::InvalidArgumentError(absl::StrCat(who, "gflops must be in [", partition::kMinSpeed,
                                                   ", ", partition::kMaxSpeed, "], got ",
                                                   r.gflops()));
  }
  if (r.cores() < 0 || r.memory_bytes() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(who, "negative cores or memory"));
  }
  // A handful of levels exist; a longer list is not a worker's (the names are logged).
  if (r.isa_levels_size() > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, r.isa_levels_size(), " isa_levels, at most 8"));
  }
  for (const std::string& level : r.isa_levels()) {
    if (level.size() > 32) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, "an isa_levels name of ", level.size(), " bytes, at most 32"));
    }
  }
  return absl::OkStatus();
}

WorkerRecord* WorkerRegistry::Find(const std::string& name) {
  auto it = workers_.find(name);
  return it == workers_.end() ? nullptr : &it->second;
}

const WorkerRecord* WorkerRegistry::Find(const std::string& name) const {
  auto it = workers_.find(name);
  return it == workers_.end() ? nullptr : &it->second;
}

WorkerRecord& WorkerRegistry::Add(const v1::RegisterWorker& info, WorkerChannel* channel) {
  WorkerRecord& w = workers_[info.name()];
  w = WorkerRecord();
  w.info = info;
  w.order = next_order_++;
  w.channel = channel;
  return w;
}

void WorkerRegistry::Remove(const std::string& name) { workers_.erase(name); }

std::vector<WorkerRecord*> WorkerRegistry::Idle(std::optional<math::Isa> isa) {
  std::vector<WorkerRecord*> idle;
  for (auto& [name, w] : workers_) {
    if (!w.job.empty()) continue;
    // Replacements and new ranks must run the job's level: its bits depend on it.
    if (isa.has_value() && !WorkerRunsIsa(w.info, *isa)) continue;
    idle.push_back(&w);
  }
  std::sort(idle.begin(), idle.end(),
            [](const WorkerRecord* a, const WorkerRecord* b) { return a->order < b->order; });
  return idle;
}

int WorkerRegistry::Busy() const {
  int busy = 0;
  for (const auto& [name, w] : workers_) busy += w.job.empty() ? 0 : 1;
  return busy;
}

std::vector<const WorkerRecord*> WorkerRegistry::InOrder() const {
  std::vector<const WorkerRecord*> all;
  for (const auto& [name, w] : workers_) all.push_back(&w);
  std::sort(all.begin(), all.end(),
            [](const WorkerRecord* a, const WorkerRecord* b) { return a->order < b->order; });
  return all;
}

void WorkerRegistry::Take(const std::string& name, const std::string& job, int rank) {
  if (WorkerRecord* w = Find(name); w != nullptr) {
    w->job = job;
    w->rank = rank;
  }
}

void WorkerRegistry::FreeJob(const std::string& job) {
  for (auto& [name, w] : workers_) {
    if (w.job == job) {
      w.job.clear();
      w.rank = -1;
    }
  }
}

bool WorkerRegistry::Holds(const std::string& name, const std::string& job) const {
  const WorkerRecord* w = Find(name);
  return w != nullptr && w->job == job;
}

std::string WorkerRegistry::AddressOf(const std::string& name) const {
  const WorkerRecord* w = Find(name);
  return w == nullptr ? "" : w->info.address();
}

void WorkerRegistry::SendIfHolding(const std::string& name, const std::string& job,
                                   const v1::WorkerCommand& command) const {
  const WorkerRecord* w = Find(name);
  if (w != nullptr && w->job == job) w->channel->Send(command);
}

std::map<std::string, int> WorkerRegistry::CountByState() const {
  std::map<std::string, int> by_state = {{"idle", 0}, {"busy", 0}};
  for (const auto& [name, w] : workers_) ++by_state[w.job.empty() ? "idle" : "busy"];
  return by_state;
}

}  // namespace pipetrain::coordinator
