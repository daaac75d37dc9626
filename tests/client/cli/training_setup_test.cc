#include "client/cli/training_setup.h"

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/model/model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::cli {
namespace {

using ::testing::HasSubstr;

std::string WriteTemp(const std::string& name, const std::string& contents) {
  const std::string path = ::testing::TempDir() + "/training_setup_" + name;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << contents;
  return path;
}

v1::ModelSpec Spec(const std::string& text) {
  absl::StatusOr<v1::ModelSpec> spec = model::ParseModelSpecText(text, "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::ModelSpec();
}

// A label the model cannot output is refused when the data set is bound to the model, naming
// file:line:column -- not when its batch is trained, with no file or line (issue 34).
TEST(TrainingSetupTest, ClassLabelsBeyondTheModelsOutputNameFileAndLine) {
  const std::string path =
      WriteTemp("labels.csv", "f1,f2,label\n1,2,0\n3,4,2\n\n5,6,7\n7,8,1\n9,1,9\n2,2,1\n");
  const v1::ModelSpec spec = Spec(R"pb(
    input_features: 2
    layers { linear { out_features: 4 } }
    layers { relu {} }
    layers { linear { out_features: 3 } }
    loss { softmax_cross_entropy {} }
  )pb");
  absl::StatusOr<TrainingSetup> setup = SetUpTraining(spec, "csv:" + path, "", 1);
  ASSERT_EQ(setup.status().code(), absl::StatusCode::kInvalidArgument) << setup.status();
  EXPECT_EQ(setup.status().message(),
            absl::StrCat(path,
                         ":5:3: class label 7 is out of range for the model, whose last layer "
                         "outputs 3 classes (labels 0 to 2); the data set has 10: set the last "
                         "linear layer's out_features to 10, or to 0 to take the data set's"));

  // Enough classes: fine, and so is a model that takes its classes from the data.
  v1::ModelSpec wide = spec;
  wide.mutable_layers(2)->mutable_linear()->set_out_features(10);
  EXPECT_TRUE(SetUpTraining(wide, "csv:" + path, "", 1).ok());
  v1::ModelSpec from_data = spec;
  from_data.mutable_layers(2)->mutable_linear()->set_out_features(0);
  absl::StatusOr<TrainingSetup> filled = SetUpTraining(from_data, "csv:" + path, "", 1);
  ASSERT_TRUE(filled.ok()) << filled.status();
  EXPECT_EQ(filled->model->output_features(), 10);
  // A regression loss has no classes to check.
  v1::ModelSpec mse = spec;
  mse.mutable_layers(2)->mutable_linear()->set_out_features(1);
  mse.mutable_loss()->mutable_mse();
  EXPECT_TRUE(SetUpTraining(mse, "csv:" + path, "", 1).ok());
}

// Without --data the model decides where that is unambiguous; otherwise the error says what to
// pass. Data of the wrong kind for the model says which --data fits.
TEST(TrainingSetupTest, DefaultDataIsWhatTheModelImplies) {
  const v1::ModelSpec gpt = Spec(R"pb(
    input_features: 1
    layers { embedding { vocab_size: 0 dim: 8 context: 4 } }
    layers { linear { out_features: 0 } }
    loss { softmax_cross_entropy {} }
  )pb");
  EXPECT_EQ(DefaultDataFor(gpt).value_or(""), "text");
  const v1::ModelSpec mlp = Spec(R"pb(
    layers { linear { out_features: 10 } }
    loss { softmax_cross_entropy {} }
  )pb");
  EXPECT_EQ(DefaultDataFor(mlp).value_or(""), "digits");
  v1::ModelSpec narrow = mlp;
  narrow.mutable_layers(0)->mutable_linear()->set_out_features(3);
  EXPECT_THAT(DefaultDataFor(narrow).status().message(),
              HasSubstr("because it outputs 3 classes, not 10: pass --data csv:PATH, npy:"));
  v1::ModelSpec mse = mlp;
  mse.mutable_loss()->mutable_mse();
  EXPECT_THAT(DefaultDataFor(mse).status().message(),
              HasSubstr("because its loss is mse (regression targets): pass --data csv:PATH, "
                        "npy:FEATURES.npy,TARGETS.npy or npy:DIR"));
  // "" is the default; the bundled digits need the data directory of the source tree.
  absl::StatusOr<TrainingSetup> s = SetUpTraining(mlp, "", PIPETRAIN_SOURCE_DIR "/data", 1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->data->info().name, "digits");
  EXPECT_EQ(SetUpTraining(mse, "", "", 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(SetUpTraining(gpt, "digits", "", 1).status().message(),
              HasSubstr("pass --data text, text:PATH or tokens:PATH"));
  EXPECT_THAT(SetUpTraining(mlp, "text", "", 1).status().message(),
              HasSubstr("holds token ids, for a model that starts with an embedding layer"));
}

// An mse model whose last layer leaves out_features 0 takes one regression target per row from
// a CSV, and its width from the data.
TEST(TrainingSetupTest, MseModelReadsRegressionTargets) {
  const std::string path = WriteTemp("regression.csv", "1,2,0.5\n3,4,-1.25\n5,6,2\n");
  v1::ModelSpec spec = Spec(R"pb(
    layers { linear { out_features: 0 } }
    loss { mse {} }
  )pb");
  absl::StatusOr<TrainingSetup> s = SetUpTraining(spec, "csv:" + path, "", 1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->data->info().input_features, 2);
  EXPECT_EQ(s->data->info().target_features, 1);
  EXPECT_EQ(s->model->output_features(), 1);
  // Two outputs: the last two columns are targets.
  spec.mutable_layers(0)->mutable_linear()->set_out_features(2);
  s = SetUpTraining(spec, "csv:" + path, "", 1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->data->info().input_features, 1);
  EXPECT_EQ(s->data->info().target_features, 2);
}

// Negative labels are refused when the file is read, with file:line:column as well.
TEST(TrainingSetupTest, NegativeLabelsNameFileAndLine) {
  const std::string path = WriteTemp("negative.csv", "1,2,0\n3,4,-1\n");
  const v1::ModelSpec spec = Spec(R"pb(
    input_features: 2
    layers { linear { out_features: 3 } }
    loss { softmax_cross_entropy {} }
  )pb");
  absl::StatusOr<TrainingSetup> setup = SetUpTraining(spec, "csv:" + path, "", 1);
  ASSERT_EQ(setup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(setup.status().message(), absl::StrCat(path, ":2:3: class label '-1' is negative"));
}

// The next-token targets of a text data set are its vocabulary's ids: a head narrower than the
// vocabulary is refused naming the first byte it cannot predict.
TEST(TrainingSetupTest, TokenIdsBeyondTheModelsOutputNameTheTextOffset) {
  const std::string path = WriteTemp("text.txt", "abcabcabcabcabcdefabcabcabcabcabc\n");
  const v1::ModelSpec spec = Spec(R"pb(
    input_features: 1
    layers { embedding { vocab_size: 7 dim: 4 context: 3 } }
    layers { linear { out_features: 5 } }
    loss { softmax_cross_entropy {} }
  )pb");
  absl::StatusOr<TrainingSetup> setup = SetUpTraining(spec, "text:" + path, "", 1);
  ASSERT_EQ(setup.status().code(), absl::StatusCode::kInvalidArgument) << setup.status();
  // Vocabulary "\nabcdef": 'e' is token 5, first at byte 16.
  EXPECT_EQ(setup.status().message(),
            absl::StrCat(path,
                         ": byte 16 ('e', token 5) is out of range for the model, whose last "
                         "layer outputs 5 classes (tokens 0 to 4); the data set has 7: set the "
                         "last linear layer's out_features to 7, or to 0 to take the data set's"));
}

}  // namespace
}  // namespace pipetrain::cli
