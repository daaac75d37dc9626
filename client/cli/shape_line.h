// The line `pipetrain train`, `local` and `watch` print for a change of a job's shape
// (v1::ShapeChange: a growth onto idle workers, or a growth that failed; docs/scaling.md, "Jobs
// that change shape"). Pure functions, thread-safe.
#ifndef PIPETRAIN_CLIENT_CLI_SHAPE_LINE_H_
#define PIPETRAIN_CLIENT_CLI_SHAPE_LINE_H_

#include <string>

#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::cli {

// "step 12: grew from 2 to 3 stages (worker w2 joined) in 0.80 s; generation 2 on w0, w1, w2\n",
// or "step 12: did not grow (WHY); stays at 2 stages\n" for a failed growth; with `json`, one
// JSON object {"shape_change": {...}} and a newline.
std::string ShapeChangeLine(const v1::ShapeChange& change, bool json);

// "2 stages", "2 replicas x 3 stages": the shape of a job that runs `spec`.
std::string ShapeOfSpec(const v1::JobSpec& spec);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_SHAPE_LINE_H_
