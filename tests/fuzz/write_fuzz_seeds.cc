// Writes the generated part of the fuzz seed corpus: encoded frames (frame_decoder/), safetensors
// files (safetensors/), JobSpecs built from the bundled example models (job_spec/) and partitioner
// and simulator inputs (partition/, the format of partition_input.h).
// Usage: write_fuzz_seeds SOURCE_DIR (the repository; writes into SOURCE_DIR/tests/fuzz/<target>/).
// The CSV seeds are written by hand. Run by hand when the formats change; the output is committed.
#include <google/protobuf/text_format.h>
#include <grpcpp/impl/grpc_library.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/io/safetensors.h"
#include "common/model/model.h"
#include "common/wire/frame_codec.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "tests/fuzz/partition_input.h"
#include "tests/integration/run_command.h"

namespace {

namespace wire = pipetrain::wire;

bool Write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  return out.good();
}

// The frame_decoder target's message format: 2-byte little-endian length, then the message.
void AppendMessage(const grpc::ByteBuffer& buffer, std::string* out) {
  std::vector<grpc::Slice> slices;
  std::string message;
  if (!buffer.Dump(&slices).ok()) std::abort();
  for (const grpc::Slice& s : slices) {
    message.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  out->push_back(static_cast<char>(message.size() & 0xFF));
  out->push_back(static_cast<char>(message.size() >> 8));
  out->append(message);
}

std::string Frames(wire::TensorKey key, int rows, int cols, int64_t fragment_bytes) {
  auto tensor = std::make_shared<pipetrain::math::Matrix>(rows, cols);
  for (int i = 0; i < rows * cols; ++i) tensor->data()[i] = 0.25f * static_cast<float>(i) - 1;
  absl::StatusOr<std::vector<grpc::ByteBuffer>> frames =
      wire::EncodeTensor({"job-fuzz", 1}, key, tensor, fragment_bytes);
  if (!frames.ok()) std::abort();
  std::string out = {3, 3};  // M = 4, 4 chunks
  grpc::ByteBuffer credit;
  if (!wire::EncodeCredit(4096, &credit).ok()) std::abort();
  AppendMessage(credit, &out);
  for (const grpc::ByteBuffer& b : *frames) AppendMessage(b, &out);
  return out;
}

// A partition target input (partition_input.h): flags, S, V, L bytes, then the numbers.
std::string PartitionInput(uint8_t flags, int stages, int virtual_stages, int layers,
                           const std::vector<double>& numbers, const std::string& tail = "") {
  std::string out = {static_cast<char>(flags), static_cast<char>(stages - 1),
                     static_cast<char>(virtual_stages - 1), static_cast<char>(layers - 1)};
  for (double x : numbers) pipetrain::fuzz::AppendNumber(x, &out);
  return out + tail;
}

// The simulation part: kind index, S, M, V bytes, then FLOPs (4 per chunk), S speeds, latency,
// bandwidth, the extras byte and its numbers.
std::string SimulationInput(int kind, int stages, int microbatches, int virtual_stages,
                            const std::vector<double>& numbers) {
  std::string out = {static_cast<char>(kind), static_cast<char>(stages - 1),
                     static_cast<char>(microbatches - 1), static_cast<char>(virtual_stages - 1)};
  for (double x : numbers) pipetrain::fuzz::AppendNumber(x, &out);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_fuzz_seeds SOURCE_DIR\n");
    return 2;
  }
  static grpc::internal::GrpcLibraryInitializer initializer;
  initializer.summon();
  const std::string dir = std::string(argv[1]) + "/tests/fuzz/";
  bool ok = true;
  ok &= Write(dir + "frame_decoder/activation_one_frame",
              Frames({0, 1, 1, wire::TensorKind::kActivation}, 3, 5, 1 << 20));
  ok &= Write(dir + "frame_decoder/gradient_four_fragments",
              Frames({2, 3, 2, wire::TensorKind::kGradient}, 4, 4, 16));
  ok &= Write(dir + "frame_decoder/input_chunk0",
              Frames({5, 0, 0, wire::TensorKind::kInput}, 2, 8, 24));

  pipetrain::math::Tensor a{{2, 3}, {1, 2, 3, 4, 5, 6}};
  pipetrain::math::Tensor b{{4}, {-1, 0.5f, 1e-30f, 3e38f}};
  pipetrain::math::Tensor scalar{{}, {42}};
  pipetrain::math::Tensor empty{{0, 3}, {}};
  absl::StatusOr<std::string> st = pipetrain::io::SerializeSafetensors(
      {{"layer.weight", a}, {"layer.bias", b}}, {{"format", "pt"}, {"step", "7"}});
  ok &= st.ok() && Write(dir + "safetensors/two_tensors_metadata", *st);
  st = pipetrain::io::SerializeSafetensors({{"s", scalar}, {"e", empty}}, {});
  ok &= st.ok() && Write(dir + "safetensors/scalar_and_empty", *st);

  for (const char* name : {"mlp_digits", "deep_mlp", "gpt_char"}) {
    absl::StatusOr<pipetrain::v1::ModelSpec> model = pipetrain::model::ParseModelSpecText(
        pipetrain::testing::ReadFile(std::string(argv[1]) + "/examples/" + name + ".textproto"),
        name);
    if (!model.ok()) {
      std::fprintf(stderr, "%s: %s\n", name, model.status().ToString().c_str());
      return 1;
    }
    pipetrain::v1::JobSpec spec;
    *spec.mutable_model() = *model;
    spec.set_schedule("1f1b");
    spec.set_stages(2);
    spec.set_microbatches(4);
    spec.set_seed(1);
    spec.mutable_optimizer()->mutable_sgd()->set_lr(0.01f);
    std::string text;
    google::protobuf::TextFormat::PrintToString(spec, &text);
    ok &= Write(dir + "job_spec/" + name + "_1f1b", "t" + text);
    spec.set_schedule("interleaved");
    spec.set_virtual_stages(2);
    spec.set_microbatches(8);
    spec.mutable_optimizer()->mutable_adamw()->set_lr(0.001f);
    ok &= Write(dir + "job_spec/" + name + "_interleaved_binary", spec.SerializeAsString());
  }
  // Partitioner: the docs' 1..9 over 3 linear stages; ZB-V's V-shape with a worker twice as fast;
  // looped with memory caps and transfer times, then a simulated 1F1B; and the inputs of issue
  // 34 (costs of 1e308: a segfault; a speed of 1e-310: a segfault in the memory report; speeds
  // of 1e200 and 1e-300: "invalid boundaries"), now INVALID_ARGUMENT.
  ok &= Write(dir + "partition/linear_1_to_9",
              PartitionInput(0, 3, 1, 9, {1, 2, 3, 4, 5, 6, 7, 8, 9}));
  ok &= Write(dir + "partition/vshape_speeds",
              PartitionInput(2 | 4, 2, 2, 9, {5, 1, 1, 1, 1, 1, 1, 1, 5, 1, 2}));
  std::vector<double> looped = {4, 3, 2, 1, 1, 2, 3, 4};             // costs
  looped.insert(looped.end(), {1.5, 1});                             // speeds
  looped.insert(looped.end(), {8, 8, 4, 4, 4, 4, 8, 8});             // layer memory
  looped.insert(looped.end(), {30, 30});                             // caps
  looped.insert(looped.end(), {0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5});  // boundary times
  std::vector<double> sim(8, 2.0);                                   // 1F1B S=2: 2 chunks x F,B,I,W
  sim.insert(sim.end(), {1e9, 5e8, 1e-3, 1e6, 3, 1, 1, 100, 100});
  ok &=
      Write(dir + "partition/looped_caps_times_simulated",
            PartitionInput(1 | 4 | 8 | 16 | 32, 2, 2, 8, looped, SimulationInput(1, 2, 4, 1, sim)));
  ok &= Write(dir + "partition/regression_costs_1e308",
              PartitionInput(0, 2, 1, 3, {1e308, 1e308, 1e308}));
  ok &= Write(dir + "partition/regression_speed_1e-310",
              PartitionInput(4, 2, 1, 4, {1, 2, 3, 4, 1e-310, 1}));
  ok &= Write(dir + "partition/regression_speeds_1e200_1e-300",
              PartitionInput(2 | 4, 2, 2, 6, {1, 2, 3, 4, 5, 6, 1e200, 1e-300}));
  std::vector<double> zbv(16, 1e30);  // ZB-V S=2: 4 chunks x F,B,I,W at the FLOP limit
  zbv.insert(zbv.end(),
             {1e-3, 1e18, 1e33, 1e-3, 3, 1e30, 1e30, 1e30, 1e30, 1e30, 1e30, 1e30, 1e30});
  ok &= Write(dir + "partition/simulated_zbv_at_the_limits",
              PartitionInput(32, 1, 1, 1, {1}, SimulationInput(4, 2, 4, 2, zbv)));
  if (!ok) {
    std::fprintf(stderr, "write_fuzz_seeds: could not write under %s\n", dir.c_str());
    return 1;
  }
  return 0;
}
