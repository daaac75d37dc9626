// libFuzzer target: the CSV data set reader (common/io/dataset, "csv:PATH"), end to end through
// OpenDataset (the file is written to a private temporary directory, gzip detection included).
// A data set that opens must have consistent shapes, finite features and integral labels below
// num_classes (CheckLabelsForModel agrees), and a batch sampler over it must work.
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/io/dataset.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

// The path the inputs are written to: in a fresh directory under $TMPDIR (or /tmp).
const std::string& CsvPath() {
  static const std::string path = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string dir =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/pipetrain_csv_fuzz_XXXXXX";
    if (mkdtemp(dir.data()) == nullptr) std::abort();
    return dir + "/data.csv";
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = CsvPath();
  FILE* f = std::fopen(path.c_str(), "wb");
  PT_FUZZ_CHECK(f != nullptr);
  PT_FUZZ_CHECK(std::fwrite(data, 1, size, f) == size);
  PT_FUZZ_CHECK(std::fclose(f) == 0);
  pipetrain::io::DatasetOptions options;
  options.max_file_bytes = int64_t{1} << 20;
  options.max_samples = 4096;
  absl::StatusOr<std::unique_ptr<pipetrain::io::Dataset>> dataset =
      pipetrain::io::OpenDataset("csv:" + path, options);
  if (!dataset.ok()) return 0;
  const pipetrain::io::DatasetInfo& info = (*dataset)->info();
  PT_FUZZ_CHECK(info.input_features >= 1 && info.target_features == 1);
  PT_FUZZ_CHECK(info.tokens_per_sample == 1 && info.num_classes >= 1);
  const int64_t train = (*dataset)->size(pipetrain::io::Split::kTrain);
  const int64_t eval = (*dataset)->size(pipetrain::io::Split::kEval);
  PT_FUZZ_CHECK(train >= 1 && eval >= 0 && train + eval <= options.max_samples);
  std::vector<float> inputs(static_cast<size_t>(info.input_features));
  float target = 0;
  for (pipetrain::io::Split split : {pipetrain::io::Split::kTrain, pipetrain::io::Split::kEval}) {
    for (int64_t i = 0; i < (*dataset)->size(split); ++i) {
      (*dataset)->GetSample(split, i, inputs.data(), &target);
      for (float x : inputs) PT_FUZZ_CHECK(std::isfinite(x));
      PT_FUZZ_CHECK(target >= 0 && target < static_cast<float>(info.num_classes) &&
                    target == std::floor(target));
    }
  }
  // Every label fits a model of num_classes classes; one class fewer names a row.
  PT_FUZZ_CHECK((*dataset)->CheckLabelsForModel(info.num_classes).ok());
  PT_FUZZ_CHECK((*dataset)->CheckLabelsForModel(info.num_classes - 1).code() ==
                absl::StatusCode::kInvalidArgument);
  absl::StatusOr<pipetrain::io::BatchSampler> sampler =
      pipetrain::io::BatchSampler::Create(dataset->get(), 1 + train / 2, 7);
  PT_FUZZ_CHECK(sampler.ok());
  const pipetrain::io::Batch batch = sampler->Next();
  PT_FUZZ_CHECK(batch.samples == 1 + train / 2);
  PT_FUZZ_CHECK(batch.inputs.rows() == batch.samples && batch.inputs.cols() == info.input_features);
  return 0;
}
