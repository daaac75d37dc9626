// Writes the generated part of the fuzz seed corpus: encoded frames (frame_decoder/), safetensors
// files (safetensors/) and JobSpecs built from the bundled example models (job_spec/).
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
  if (!ok) {
    std::fprintf(stderr, "write_fuzz_seeds: could not write under %s\n", dir.c_str());
    return 1;
  }
  return 0;
}
