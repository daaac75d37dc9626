// `pipetrain partition`: the best contiguous cut of a model's layers over the pipeline workers.
//
//   pipetrain partition --costs c0,c1,... | --model FILE --stages S [--speeds s0,...]
//       [--memory-cap BYTES[,BYTES...]] [--format text|json]
//
// main() parses the flags into strings (and, for --model, computes the per-layer costs and
// memory itself) and calls ParsePartitionCommandOptions() once. Thread-safe pure functions.
#ifndef PIPETRAIN_CLIENT_CLI_PARTITION_COMMAND_H_
#define PIPETRAIN_CLIENT_CLI_PARTITION_COMMAND_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/schedule/ir.h"

namespace pipetrain::cli {

enum class PartitionFormat {
  kText,  // Table per worker, boundaries, bottleneck and imbalance.
  kJson,  // One JSON object with the same content.
};

// Per-layer figures of a model file, computed by the caller for --model.
struct ModelLayers {
  std::vector<double> costs;         // [layer] cost per micro-batch (e.g. F+B+W FLOPs), >= 0.
  std::vector<double> memory_bytes;  // [layer] bytes; empty if unknown (then no --memory-cap).
};

struct PartitionCommandOptions {
  // --costs or ModelLayers::costs. Required, each in [0, partition::kMaxLayerCost] (1e30).
  std::vector<double> layer_costs;
  std::vector<double> layer_memory;  // ModelLayers::memory_bytes; required by memory_caps.
  int stages = 0;                    // --stages S, required, >= 1.
  // --speeds: S values in [partition::kMinSpeed, partition::kMaxSpeed] (1e-6 to 1e9; default:
  // all 1).
  std::vector<double> speeds;
  // --memory-cap: one value for every worker or S values; bytes with an optional suffix
  // K, M, G, T (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), at most
  // partition::kMaxMemoryBytes (2^53). Default: no cap.
  std::vector<double> memory_caps;
  // Placement of the chunks; optional (default linear, V = 1). main() may expose it as
  // --schedule (or --kind: a schedule kind picks its placement) and --virtual.
  schedule::PlacementKind placement = schedule::PlacementKind::kLinear;
  int virtual_stages = 1;
  PartitionFormat format = PartitionFormat::kText;  // --format (default text).
};

// One --memory-cap value: "16GiB", "1.5G", "4096" — bytes with an optional suffix K, M, G, T
// (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), in [0, partition::kMaxMemoryBytes].
// INVALID_ARGUMENT naming --memory-cap and the value otherwise. Pure.
absl::StatusOr<double> ParseMemoryBytes(absl::string_view text);

// Parses raw flag values (empty = not given). Exactly one of `costs_csv` and `model` must be
// given. `kind` (optional) is a schedule kind whose placement to cut for ("interleaved" ->
// looped, "zb-v"/"dualpipe-v" -> V-shape, others linear); `virtual_stages` (optional) defaults
// to the kind's default. INVALID_ARGUMENT naming the flag and the rule.
absl::StatusOr<PartitionCommandOptions> ParsePartitionCommandOptions(
    absl::string_view costs_csv, absl::string_view speeds_csv, absl::string_view memory_caps_csv,
    absl::string_view stages, absl::string_view format, const ModelLayers* model = nullptr,
    absl::string_view kind = "", absl::string_view virtual_stages = "");

// Partitions and returns the report (ending with a newline). Errors from
// partition::PartitionLayers: INVALID_ARGUMENT for bad inputs, RESOURCE_EXHAUSTED when no cut
// fits the memory caps.
absl::StatusOr<std::string> RunPartitionCommand(const PartitionCommandOptions& options);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_PARTITION_COMMAND_H_
