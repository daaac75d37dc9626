// The one-way latency of the tensors between workers in a measured step, from what each end
// recorded on its own clock. Feeds the simulator's link model (CostModel::link) so that the
// predicted timeline of a measured step charges the communication it really had.
// Plain values and a pure function.
#ifndef PIPETRAIN_COMMON_SCHEDULE_LINK_LATENCY_H_
#define PIPETRAIN_COMMON_SCHEDULE_LINK_LATENCY_H_

#include <cstdint>
#include <optional>
#include <vector>

namespace pipetrain::schedule {

// One tensor between two workers, as one end saw it: rank `rank` sent it to (or received it
// from) rank `peer`. Times are on `rank`'s own clock (any origin), in any one unit.
struct LinkObservation {
  bool send = false;
  int rank = 0;
  int peer = 0;
  int kind = 0;  // what the tensor is (activation, gradient, ...): part of its identity.
  int32_t microbatch = 0;
  int32_t chunk = 0;
  double start = 0;  // send: handed to the link; receive: first byte arrived.
  double end = 0;    // send: written; receive: whole, handed on.
};

// The one-way latency of a tensor between two workers: from the sender handing it to its link to
// the receiver having it whole. A tensor's apparent delay (receive end minus send start) mixes
// the latency with the offset between the two clocks; the offset enters the two directions of a
// pair of workers with opposite signs, so for every pair with tensors both ways the mean of the
// two directions' median delays is free of it. Returns the median of those over the pairs
// (clamped at 0), or nullopt when no pair of workers sent tensors both ways. Tensors seen by only
// one end are ignored, and so are observations with a time that is not finite and tensors whose
// delay is not (the result is always finite).
std::optional<double> EstimateLinkLatency(const std::vector<LinkObservation>& observations);

}  // namespace pipetrain::schedule

#endif  // PIPETRAIN_COMMON_SCHEDULE_LINK_LATENCY_H_
