// Writes the batches a data set gives, as raw float32 bytes on stdout, so that the Python data
// module's test (tests/client/python/test_formats.py) can compare its own with them bit for bit.
//   dataset_dump SPEC CONTEXT REGRESSION_TARGETS VOCAB_SIZE BATCH SEED STEPS
// writes, for each of STEPS batches of BatchSampler(BATCH, SEED), its inputs then its targets
// (row-major), then the inputs and targets of every held-out sample (MakeEvalBatch). Exit status
// 1 with the error on stderr if the data set does not open.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/io/dataset.h"

namespace {

void Write(const pipetrain::math::Matrix& m) {
  std::fwrite(m.data(), sizeof(float), static_cast<size_t>(m.size()), stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr,
                 "usage: dataset_dump SPEC CONTEXT REGRESSION_TARGETS VOCAB_SIZE BATCH SEED "
                 "STEPS\n");
    return 2;
  }
  pipetrain::io::DatasetOptions options;
  options.context = std::atoll(argv[2]);
  options.regression_targets = std::atoll(argv[3]);
  options.vocab_size = std::atoll(argv[4]);
  auto dataset = pipetrain::io::OpenDataset(argv[1], options);
  if (!dataset.ok()) {
    std::fprintf(stderr, "%s\n", dataset.status().ToString().c_str());
    return 1;
  }
  auto sampler = pipetrain::io::BatchSampler::Create(dataset->get(), std::atoll(argv[5]),
                                                     std::strtoull(argv[6], nullptr, 10));
  if (!sampler.ok()) {
    std::fprintf(stderr, "%s\n", sampler.status().ToString().c_str());
    return 1;
  }
  for (int64_t step = 0; step < std::atoll(argv[7]); ++step) {
    const pipetrain::io::Batch batch = sampler->Next();
    Write(batch.inputs);
    Write(batch.targets);
  }
  const pipetrain::io::Batch eval =
      pipetrain::io::MakeEvalBatch(**dataset, 0, (*dataset)->size(pipetrain::io::Split::kEval));
  Write(eval.inputs);
  Write(eval.targets);
  return std::fflush(stdout) == 0 ? 0 : 1;
}
