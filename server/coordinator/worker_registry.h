// WorkerRegistry: the coordinator's registered stage workers — who they are (RegisterWorker), the
// channel of their Join stream, and the job and rank each one holds (none: idle). Not
// thread-safe: the coordinator core keeps it under its lock.
#ifndef PIPETRAIN_SERVER_COORDINATOR_WORKER_REGISTRY_H_
#define PIPETRAIN_SERVER_COORDINATOR_WORKER_REGISTRY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/math/isa.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/coordinator/worker_channel.h"

namespace pipetrain::coordinator {

// One registered worker: live while its Join stream is open.
struct WorkerRecord {
  v1::RegisterWorker info;
  int64_t order = 0;                 // registration order.
  WorkerChannel* channel = nullptr;  // its Join stream; valid while registered.
  std::string job;                   // the job it holds a rank of; empty when idle.
  int rank = -1;  // its position in `job` (job_shape.h: its rank with one replica); -1: idle.
  // The links it measured to other workers (its LinksProbed), by target name.
  std::map<std::string, v1::MeasuredLink> links;
};

class WorkerRegistry {
 public:
  // OK if `r` is a well-formed registration: a name, an address, a speed the partitioner takes
  // (partition::kMinSpeed to kMaxSpeed GFLOP/s),
  // non-negative cores and memory, at most 8 instruction-set names of at most 32 bytes each.
  // INVALID_ARGUMENT naming the worker and the field otherwise.
  static absl::Status CheckRegistration(const v1::RegisterWorker& r);

  // The worker named `name`, or null.
  WorkerRecord* Find(const std::string& name);
  const WorkerRecord* Find(const std::string& name) const;

  // Registers `info` on `channel` (which must outlive the registration), idle, after every
  // worker registered before. Replaces nothing: the caller removes a worker of the same name
  // first.
  WorkerRecord& Add(const v1::RegisterWorker& info, WorkerChannel* channel);

  // Forgets worker `name` (no-op if unknown).
  void Remove(const std::string& name);

  // Idle workers in registration order; with `isa`, only those that run that level.
  std::vector<WorkerRecord*> Idle(std::optional<math::Isa> isa = std::nullopt);

  // The number of workers holding a rank of some job.
  int Busy() const;

  // Every worker, in registration order.
  std::vector<const WorkerRecord*> InOrder() const;

  // `name` holds rank `rank` of `job` (no-op for an unknown worker).
  void Take(const std::string& name, const std::string& job, int rank);

  // Every worker of `job` becomes idle.
  void FreeJob(const std::string& job);

  // True if `name` is registered and holds a rank of `job`.
  bool Holds(const std::string& name, const std::string& job) const;

  // The StageWorker address of `name`, or "" if it is not registered.
  std::string AddressOf(const std::string& name) const;

  // Sends `command` to `name` if it is registered and holds a rank of `job`.
  void SendIfHolding(const std::string& name, const std::string& job,
                     const v1::WorkerCommand& command) const;

  // Worker metrics by state ("idle", "busy").
  std::map<std::string, int> CountByState() const;

 private:
  std::map<std::string, WorkerRecord> workers_;
  int64_t next_order_ = 0;
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_WORKER_REGISTRY_H_
