// The C++ side of the optimizer-text conformance table (optimizer_texts.json): for each row, the
// optimizer the C++ client makes of it, or the one the coordinator makes of the OptimizerSpec the
// Python client built from it, in one canonical line per row:
//   "ok <math::FormatOptimizerConfig> | lr S=V S=V ..." (the rate of the row's updates, %.9g)
//   "CODE | message"
//
//   optimizer_driver cli TABLE      the row as `pipetrain train` reads it: --optimizer's text and
//                                   the row's lr_schedule as --lr-schedule, --warmup-steps,
//                                   --lr-decay-steps, --lr-min (cli::OptimizerConfigFor; no
//                                   --steps to default the decay to)
//   optimizer_driver spec TABLE     one line per row on stdin, as optimizer_driver.py prints the
//                                   Python client's pipetrain.optimizer_spec(...): "ok
//                                   <OptimizerSpec in text format>" read as the coordinator reads
//                                   it (model::OptimizerFromProto), or the Python error passed on.
// Exit code 0 (the runner compares the lines), 2 for bad input.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/training_options.h"
#include "common/math/lr_schedule.h"
#include "common/math/optimizer.h"
#include "common/model/optimizer_proto.h"
#include "google/protobuf/text_format.h"
#include "nlohmann/json.hpp"
#include "pipetrain/v1/model.pb.h"

namespace pipetrain {
namespace {

using nlohmann::json;

// The canonical line of `config` for `row`.
std::string Canonical(const absl::StatusOr<math::OptimizerConfig>& config, const json& row) {
  if (!config.ok()) {
    return absl::StrCat(absl::StatusCodeToString(config.status().code()), " | ",
                        config.status().message());
  }
  std::string line = absl::StrCat("ok ", math::FormatOptimizerConfig(*config), " | lr");
  for (const json& step : row.value("lr_at_steps", json::array())) {
    const float lr = math::LearningRateAt(config->schedule, config->lr, step.get<int64_t>());
    absl::StrAppend(&line, absl::StrFormat(" %d=%.9g", step.get<int64_t>(), lr));
  }
  return line;
}

// The row as `pipetrain train --optimizer TEXT [--lr-schedule ...]` reads it.
absl::StatusOr<math::OptimizerConfig> FromCli(const json& row) {
  cli::TrainingOptions options;
  options.optimizer = row.at("optimizer").get<std::string>();
  options.steps = 0;  // no --steps: a decaying schedule needs --lr-decay-steps, as in Python
  if (row.contains("lr_schedule")) {
    const json& s = row["lr_schedule"];
    if (s.contains("kind")) options.lr_schedule = s["kind"].get<std::string>();
    if (s.contains("warmup_steps")) options.warmup_steps = s["warmup_steps"].get<int64_t>();
    if (s.contains("decay_steps")) options.lr_decay_steps = s["decay_steps"].get<int64_t>();
    if (s.contains("min_lr")) options.lr_min = static_cast<float>(s["min_lr"].get<double>());
  }
  return cli::OptimizerConfigFor(options);
}

// The Python client's answer `line` for a row, as the coordinator reads its OptimizerSpec.
absl::StatusOr<math::OptimizerConfig> FromPython(const std::string& line) {
  if (!absl::StartsWith(line, "ok ")) {
    // The Python client refused the row itself: "CODE | message".
    const size_t bar = line.find(" | ");
    absl::StatusCode code = absl::StatusCode::kUnknown;
    const std::string name = line.substr(0, bar);
    for (int c = 0; c <= 16; ++c) {
      if (absl::StatusCodeToString(static_cast<absl::StatusCode>(c)) == name) {
        code = static_cast<absl::StatusCode>(c);
      }
    }
    return absl::Status(code, bar == std::string::npos ? line : line.substr(bar + 3));
  }
  v1::OptimizerSpec spec;
  if (!google::protobuf::TextFormat::ParseFromString(line.substr(3), &spec)) {
    return absl::InternalError(absl::StrCat("not an OptimizerSpec: ", line));
  }
  return model::OptimizerFromProto(spec);
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  using nlohmann::json;
  if (argc != 3 || (std::string(argv[1]) != "cli" && std::string(argv[1]) != "spec")) {
    std::fprintf(stderr, "usage: %s cli|spec TABLE.json\n", argv[0]);
    return 2;
  }
  std::ifstream file(argv[2]);
  const json table = json::parse(file, nullptr, /*allow_exceptions=*/false);
  if (table.is_discarded() || !table.contains("rows")) {
    std::fprintf(stderr, "%s: not a table\n", argv[2]);
    return 2;
  }
  const bool cli = std::string(argv[1]) == "cli";
  for (const json& row : table["rows"]) {
    absl::StatusOr<pipetrain::math::OptimizerConfig> config;
    if (cli) {
      config = pipetrain::FromCli(row);
    } else {
      std::string line;
      if (!std::getline(std::cin, line)) {
        std::fprintf(stderr, "fewer answers than rows on stdin\n");
        return 2;
      }
      config = pipetrain::FromPython(line);
    }
    std::cout << pipetrain::Canonical(config, row) << "\n";
  }
  return 0;
}
