// JobShape: a job's layout of data-parallel replicas over pipeline stages (docs/scaling.md,
// "Replicas"): R copies of an S-stage pipeline on R x S workers, the worker at position
// p = replica x S + rank. Every "by position" book of the core (Job::workers, OperationBook,
// CommitBook) is indexed by p; with one replica a position is a rank. Also the choice of which
// workers form which rank, and the one function that chooses the shape a job grows to when idle
// workers are registered (docs/scaling.md, "Jobs that change shape"). Pure values and functions:
// thread-safe.
#ifndef PIPETRAIN_SERVER_COORDINATOR_JOB_SHAPE_H_
#define PIPETRAIN_SERVER_COORDINATOR_JOB_SHAPE_H_

#include <optional>
#include <string>
#include <vector>

#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::coordinator {

struct JobShape {
  int stages = 1;    // S: ranks of one pipeline.
  int replicas = 1;  // R: copies of the pipeline.

  // R x S.
  int positions() const { return stages * replicas; }
  // The rank and replica of position `p` (0 <= p < positions()).
  int RankOf(int p) const { return p % stages; }
  int ReplicaOf(int p) const { return p / stages; }
  // The position of `rank` in `replica`.
  int Position(int replica, int rank) const { return replica * stages + rank; }
  // "S stages" with one replica, "S stages x R replicas" with more.
  std::string ToString() const;
  bool operator==(const JobShape& o) const { return stages == o.stages && replicas == o.replicas; }
  bool operator!=(const JobShape& o) const { return !(*this == o); }
};

// The shape a checked spec asks for (stages; replicas, 0 meaning 1).
JobShape ShapeOf(const v1::JobSpec& spec);

// The shape job `spec` grows to with `idle` more workers (idle >= 0), or nullopt when it cannot
// grow. More replicas first, where spec.max_replicas allows: the largest power of two R' <=
// max_replicas whose R' x S workers the idle ones complete and whose shares the step's gradient
// tree supports (each replica more adds a pipeline's throughput, where a stage more only shortens
// it); else the most stages S' <= spec.max_stages that R x S' workers allow, the replicas
// unchanged. The caller checks the schedule and the partition (and with more stages tries fewer,
// down to S + 1).
std::optional<JobShape> NextShape(const v1::JobSpec& spec, int idle);

// Which worker takes which position: `speeds` (GFLOP/s) of shape.positions() workers in the
// order they were chosen; returns, for every position, the index of its worker. One replica: the
// workers in their order (position = rank = index). More: a rank is as fast as the slowest of its
// R workers (every replica waits for the others at the gradient reduction), so the workers sorted
// by speed, fastest first (ties: in their order), are cut into S groups of R consecutive ones —
// which makes the k-th fastest rank as fast as any grouping can — and group g takes rank g,
// its workers replicas 0..R-1 in their order. Precondition: speeds.size() == positions().
std::vector<int> ArrangePositions(const std::vector<double>& speeds, JobShape shape);

// Each rank's speed for the partitioner: the slowest of the workers holding it across the
// replicas. `speeds` by position (shape.positions() of them); returns shape.stages speeds.
std::vector<double> RankSpeeds(const std::vector<double>& speeds, JobShape shape);

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_JOB_SHAPE_H_
