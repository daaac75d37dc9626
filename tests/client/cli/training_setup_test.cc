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
