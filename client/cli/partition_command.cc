#include "client/cli/partition_command.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/cli/schedule_command.h"
#include "common/partition/partitioner.h"
#include "common/schedule/generator.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace pipetrain::cli {
namespace {

// Comma-separated numbers in [lo, hi] (the partitioner's ranges, partitioner.h).
absl::StatusOr<std::vector<double>> ParseNumbers(absl::string_view flag, absl::string_view text,
                                                 double lo, double hi) {
  std::vector<double> values;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    double v = 0;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(part), &v) || !(v >= lo && v <= hi)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " needs comma-separated numbers in [", lo, ", ", hi, "] (got \"",
                       part, "\" in \"", text, "\")"));
    }
    values.push_back(v);
  }
  return values;
}

// "512 B", "1.5 KiB", "15.22 MiB".
std::string HumanBytes(double x) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (x >= 1024 && unit < 4) {
    x /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%.0f B", x) : absl::StrFormat("%.2f %s", x, kUnits[unit]);
}

// "0-4" or "0-1,14-15": the layer ranges of a rank's chunks (inclusive).
std::string LayerRanges(const partition::Partition& p, const std::vector<int>& chunks) {
  std::vector<std::string> parts;
  for (int c : chunks) {
    const int first = p.boundaries[c];
    const int last = p.boundaries[c + 1] - 1;
    parts.push_back(first == last ? absl::StrCat(first) : absl::StrCat(first, "-", last));
  }
  return absl::StrJoin(parts, ",");
}

std::string TextReport(const PartitionCommandOptions& o, const partition::Partition& p) {
  const int s = p.placement.stages;
  std::string out = absl::StrCat(
      "partition of ", o.layer_costs.size(), " layers over ", s, " ranks (",
      schedule::PlacementKindName(p.placement.kind), " placement, ", p.placement.num_chunks(),
      " chunks): ", p.proven_optimal ? "optimal" : "best found (search budget exhausted)", "\n");
  const bool memory = !o.layer_memory.empty();
  const std::string header =
      absl::StrFormat("%-7s %-9s %-13s %-11s %-8s %-11s %s", "rank", "chunks", "layers", "cost",
                      "speed", "time", memory ? "memory" : "");
  absl::StrAppend(&out, absl::StripTrailingAsciiWhitespace(header), "\n");
  for (int w = 0; w < s; ++w) {
    const std::vector<int> chunks = p.placement.ChunksOf(w);
    const double speed = o.speeds.empty() ? 1.0 : o.speeds[w];
    std::string line = absl::StrFormat(
        "%-7d %-9s %-13s %-11s %-8s %-11s %s", w, absl::StrJoin(chunks, ","),
        LayerRanges(p, chunks), FormatNumber(p.worker_cost[w]), FormatNumber(speed),
        FormatNumber(p.worker_time[w]), memory ? HumanBytes(p.worker_memory[w]) : "");
    absl::StrAppend(&out, absl::StripTrailingAsciiWhitespace(line), "\n");
  }
  double mean = 0;
  for (double t : p.worker_time) mean += t;
  mean /= s;
  absl::StrAppend(&out, "boundaries: ", absl::StrJoin(p.boundaries, " "), "\n");
  absl::StrAppend(&out, "bottleneck ", FormatNumber(p.bottleneck), " (rank ", p.bottleneck_worker,
                  "), mean ", FormatNumber(mean), ", imbalance ", FormatNumber(p.imbalance),
                  " (max/mean)\n");
  return out;
}

std::string JsonReport(const PartitionCommandOptions& o, const partition::Partition& p) {
  nlohmann::ordered_json chunks = nlohmann::ordered_json::array();
  for (int c = 0; c < p.placement.num_chunks(); ++c) {
    chunks.push_back({{"chunk", c},
                      {"worker", p.placement.OwnerOf(c)},
                      {"first_layer", p.boundaries[c]},
                      {"end_layer", p.boundaries[c + 1]},
                      {"cost", p.chunk_cost[c]}});
  }
  nlohmann::ordered_json workers = nlohmann::ordered_json::array();
  for (int w = 0; w < p.placement.stages; ++w) {
    workers.push_back({{"worker", w},
                       {"chunks", p.placement.ChunksOf(w)},
                       {"cost", p.worker_cost[w]},
                       {"speed", o.speeds.empty() ? 1.0 : o.speeds[w]},
                       {"time", p.worker_time[w]},
                       {"memory", p.worker_memory[w]}});
  }
  const nlohmann::ordered_json report = {
      {"placement", std::string(schedule::PlacementKindName(p.placement.kind))},
      {"stages", p.placement.stages},
      {"virtual", p.placement.virtual_stages},
      {"layers", o.layer_costs.size()},
      {"boundaries", p.boundaries},
      {"chunks", std::move(chunks)},
      {"workers", std::move(workers)},
      {"bottleneck", p.bottleneck},
      {"bottleneck_worker", p.bottleneck_worker},
      {"imbalance", p.imbalance},
      {"optimal", p.proven_optimal}};
  return report.dump() + "\n";
}

}  // namespace

absl::StatusOr<double> ParseMemoryBytes(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  struct Suffix {
    const char* name;
    double factor;
  };
  static constexpr Suffix kSuffixes[] = {{"KiB", 1024.0},
                                         {"MiB", 1048576.0},
                                         {"GiB", 1073741824.0},
                                         {"TiB", 1099511627776.0},
                                         {"K", 1e3},
                                         {"M", 1e6},
                                         {"G", 1e9},
                                         {"T", 1e12},
                                         {"B", 1.0}};
  double factor = 1;
  for (const Suffix& suffix : kSuffixes) {
    if (absl::EndsWith(s, suffix.name)) {
      s.remove_suffix(std::char_traits<char>::length(suffix.name));
      factor = suffix.factor;
      break;
    }
  }
  double v = 0;
  if (!absl::SimpleAtod(s, &v) || !(v >= 0 && v * factor <= partition::kMaxMemoryBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--memory-cap needs byte counts in [0, 2^53] with an optional suffix K, M, G, T, KiB, "
        "MiB, GiB or TiB (got \"",
        text, "\")"));
  }
  return v * factor;
}

absl::StatusOr<PartitionCommandOptions> ParsePartitionCommandOptions(
    absl::string_view costs_csv, absl::string_view speeds_csv, absl::string_view memory_caps_csv,
    absl::string_view stages, absl::string_view format, const ModelLayers* model,
    absl::string_view kind, absl::string_view virtual_stages) {
  PartitionCommandOptions o;
  if (costs_csv.empty() == (model == nullptr)) {
    return absl::InvalidArgumentError("give exactly one of --costs and --model");
  }
  if (model != nullptr) {
    o.layer_costs = model->costs;
    o.layer_memory = model->memory_bytes;
  } else {
    PT_ASSIGN_OR_RETURN(o.layer_costs,
                        ParseNumbers("costs", costs_csv, 0.0, partition::kMaxLayerCost));
  }
  if (stages.empty()) {
    return absl::InvalidArgumentError(
        "--stages is required: how many pipeline stages to split the layers across");
  }
  if (!absl::SimpleAtoi(stages, &o.stages) || o.stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stages must be an integer >= 1 (got \"", stages, "\")"));
  }
  if (!speeds_csv.empty()) {
    PT_ASSIGN_OR_RETURN(
        o.speeds, ParseNumbers("speeds", speeds_csv, partition::kMinSpeed, partition::kMaxSpeed));
    if (static_cast<int>(o.speeds.size()) != o.stages) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--speeds has ", o.speeds.size(), " values; need one per stage (", o.stages, ")"));
    }
  }
  if (!memory_caps_csv.empty()) {
    for (absl::string_view part : absl::StrSplit(memory_caps_csv, ',')) {
      PT_ASSIGN_OR_RETURN(double cap, ParseMemoryBytes(part));
      o.memory_caps.push_back(cap);
    }
    if (o.memory_caps.size() == 1) o.memory_caps.assign(o.stages, o.memory_caps[0]);
    if (static_cast<int>(o.memory_caps.size()) != o.stages) {
      return absl::InvalidArgumentError(absl::StrCat("--memory-cap has ", o.memory_caps.size(),
                                                     " values; need one, or one per stage (",
                                                     o.stages, ")"));
    }
    if (o.layer_memory.empty()) {
      return absl::InvalidArgumentError(
          "--memory-cap needs the memory of every layer, which only --model provides");
    }
  }
  if (!kind.empty()) {
    PT_ASSIGN_OR_RETURN(schedule::ScheduleKind k, schedule::ParseScheduleKind(kind));
    o.placement = schedule::PlacementKindFor(k);
    o.virtual_stages = schedule::DefaultVirtualStages(k);
  }
  if (!virtual_stages.empty()) {
    if (!absl::SimpleAtoi(virtual_stages, &o.virtual_stages) || o.virtual_stages < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--virtual must be an integer >= 1 (got \"", virtual_stages, "\")"));
    }
    if (kind.empty() && o.virtual_stages > 1) o.placement = schedule::PlacementKind::kLooped;
  }
  PT_RETURN_IF_ERROR(schedule::MakePlacement(o.placement, o.stages, o.virtual_stages).status());
  if (format.empty() || format == "text") {
    o.format = PartitionFormat::kText;
  } else if (format == "json") {
    o.format = PartitionFormat::kJson;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--format must be text or json (got \"", format, "\")"));
  }
  return o;
}

absl::StatusOr<std::string> RunPartitionCommand(const PartitionCommandOptions& options) {
  partition::PartitionOptions po;
  po.stages = options.stages;
  po.placement = options.placement;
  po.virtual_stages = options.virtual_stages;
  po.speeds = options.speeds;
  po.layer_memory = options.layer_memory;
  po.memory_caps = options.memory_caps;
  PT_ASSIGN_OR_RETURN(partition::Partition p, partition::PartitionLayers(options.layer_costs, po));
  return options.format == PartitionFormat::kJson ? JsonReport(options, p) : TextReport(options, p);
}

}  // namespace pipetrain::cli
