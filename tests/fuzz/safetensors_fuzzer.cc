// libFuzzer target: the safetensors reader (common/io/safetensors). Any input is parsed; a file
// that parses must serialize again, and the serialized file must parse to bit-identical tensors
// and the same metadata.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/io/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<pipetrain::io::SafetensorsFile> file =
      pipetrain::io::ParseSafetensors(bytes, "fuzz.safetensors");
  if (!file.ok()) {
    // Every error names its source.
    PT_FUZZ_CHECK(file.status().message().find("fuzz.safetensors") != absl::string_view::npos);
    return 0;
  }
  absl::StatusOr<std::string> again =
      pipetrain::io::SerializeSafetensors(file->tensors, file->metadata);
  PT_FUZZ_CHECK(again.ok());
  absl::StatusOr<pipetrain::io::SafetensorsFile> reread =
      pipetrain::io::ParseSafetensors(*again, "reserialized");
  PT_FUZZ_CHECK(reread.ok());
  PT_FUZZ_CHECK(reread->metadata == file->metadata);
  PT_FUZZ_CHECK(reread->tensors.size() == file->tensors.size());
  for (const auto& [name, tensor] : file->tensors) {
    auto it = reread->tensors.find(name);
    PT_FUZZ_CHECK(it != reread->tensors.end());
    PT_FUZZ_CHECK(it->second.shape == tensor.shape);
    PT_FUZZ_CHECK(it->second.data.size() == tensor.data.size());
    PT_FUZZ_CHECK(tensor.data.empty() || std::memcmp(it->second.data.data(), tensor.data.data(),
                                                     tensor.data.size() * sizeof(float)) == 0);
  }
  return 0;
}
