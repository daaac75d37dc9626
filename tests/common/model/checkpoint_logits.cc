// Test tool: the outputs (logits) of a checkpoint's model on given inputs, for tests that compare
// pipetrain with another implementation (tests/common/model/hf_export_test.py).
//
//   checkpoint_logits CHECKPOINT_DIR < inputs > outputs
//
// stdin: the input rows' floats (token ids for a token model), whitespace-separated; their number
// must be a multiple of input_features x tokens_per_sample (whole samples). stdout: one line per
// row with the model's outputs as %.9g (which reads back to the same float). Exit 1 with the
// error on stderr.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/math/optimizer.h"
#include "common/model/checkpoint.h"
#include "common/model/model.h"
#include "common/model/stage.h"
#include "common/util/status_macros.h"

namespace pipetrain::model {
namespace {

absl::Status Run(const std::string& dir) {
  PT_ASSIGN_OR_RETURN(LoadedCheckpoint ckpt, LoadCheckpoint(dir));
  PT_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Build(ckpt.manifest.model_spec));
  model->kernels().ConfigureEigen(1);
  PT_ASSIGN_OR_RETURN(math::OptimizerConfig optimizer,
                      math::ParseOptimizerConfig(ckpt.manifest.optimizer));
  PT_ASSIGN_OR_RETURN(Stage stage, Stage::Create(model.get(), 0, model->num_layers(),
                                                 ckpt.manifest.seed, optimizer));
  PT_RETURN_IF_ERROR(stage.ImportState(ckpt.tensors));
  std::vector<float> values;
  for (float v; std::cin >> v;) values.push_back(v);
  const int64_t per_sample = model->input_features() * model->tokens_per_sample();
  if (values.empty() || static_cast<int64_t>(values.size()) % per_sample != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("stdin holds ", values.size(), " values, not whole samples of ", per_sample));
  }
  const int64_t rows = static_cast<int64_t>(values.size()) / model->input_features();
  math::ConstMatrixMap x(values.data(), rows, model->input_features());
  math::Matrix targets = math::Matrix::Zero(rows, model->target_features());
  PT_RETURN_IF_ERROR(
      model->ValidateBatch(x, math::AsConstMap(targets), rows / model->tokens_per_sample()));
  MicrobatchState mb;
  const math::Matrix& y = stage.Forward(x, &mb);
  for (int64_t r = 0; r < y.rows(); ++r) {
    std::string line;
    for (int64_t c = 0; c < y.cols(); ++c) {
      absl::StrAppendFormat(&line, c == 0 ? "%.9g" : " %.9g", y(r, c));
    }
    std::cout << line << "\n";
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace pipetrain::model

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: checkpoint_logits CHECKPOINT_DIR < inputs > outputs\n";
    return 2;
  }
  const absl::Status s = pipetrain::model::Run(argv[1]);
  if (!s.ok()) {
    std::cerr << "checkpoint_logits: " << s << "\n";
    return 1;
  }
  return 0;
}
