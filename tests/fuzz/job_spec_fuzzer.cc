// libFuzzer target: the coordinator's JobSpec validation (common/job/job_spec:
// proto -> schedule, optimizer and model, with the caps), which every CreateJob runs on what a
// client sent. Input: "t" then a JobSpec in protobuf text format (the seeds; mutations stay
// readable), or anything else: a binary JobSpec, as it arrives on the wire. A spec that passes
// must have a plan and model that agree with it.
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/job/job_spec.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pipetrain::v1::JobSpec spec;
  if (size >= 1 && data[0] == 't') {
    google::protobuf::TextFormat::Parser parser;
    parser.AllowPartialMessage(true);
    // Silence the parser's error log: a syntax error is an ordinary outcome here.
    class Quiet : public google::protobuf::io::ErrorCollector {
     public:
      void AddError(int, int, const std::string&) override {}
    } quiet;
    parser.RecordErrorsTo(&quiet);
    if (!parser.ParseFromString(std::string(reinterpret_cast<const char*>(data + 1), size - 1),
                                &spec)) {
      return 0;
    }
  } else if (!spec.ParseFromArray(data, static_cast<int>(size))) {
    return 0;
  }
  pipetrain::job::JobLimits limits;
  // Smaller caps than the defaults keep each run fast; the checks are the same.
  limits.max_layers = 256;
  limits.max_microbatches = 64;
  limits.model.max_parameter_bytes = int64_t{256} << 20;
  limits.model.max_activation_bytes = int64_t{256} << 20;
  absl::StatusOr<pipetrain::job::CheckedJobSpec> checked =
      pipetrain::job::CheckJobSpec(limits, &spec);
  if (!checked.ok()) return 0;
  PT_FUZZ_CHECK(checked->model != nullptr);
  PT_FUZZ_CHECK(checked->model->num_layers() <= limits.max_layers);
  PT_FUZZ_CHECK(spec.microbatches() >= 1 && spec.microbatches() <= limits.max_microbatches);
  PT_FUZZ_CHECK(checked->plan.num_chunks() == spec.stages() * spec.virtual_stages());
  PT_FUZZ_CHECK(spec.threads() >= 1);
  // What the coordinator computes next from a valid spec: the cut of the layers across equal
  // workers. Every chunk holds at least one layer and lies in the model; the two copies of a
  // bidirectional plan (dualpipe) hold the same S ranges, so S <= layers is what it needs.
  const int layers = checked->model->num_layers();
  PT_FUZZ_CHECK(static_cast<int64_t>(checked->model->LayerFlops(1).size()) == layers);
  const bool two_copies =
      checked->plan.placement.kind == pipetrain::schedule::PlacementKind::kBidirectional;
  PT_FUZZ_CHECK((two_copies ? spec.stages() : checked->plan.num_chunks()) <= layers);
  const auto cut = pipetrain::job::PartitionChunks(spec, *checked->model, checked->plan,
                                                   std::vector<double>(spec.stages(), 1.0));
  PT_FUZZ_CHECK(cut.ok());
  PT_FUZZ_CHECK(static_cast<int>(cut->first.size()) == checked->plan.num_chunks());
  for (const pipetrain::v1::ChunkSpec& chunk : cut->first) {
    PT_FUZZ_CHECK(chunk.first_layer() >= 0 && chunk.first_layer() < chunk.last_layer() &&
                  chunk.last_layer() <= layers);
  }
  return 0;
}
