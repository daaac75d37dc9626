// The npy: data sets (common/io/npy_dataset.h) through OpenDataset, as users open them.
#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/io/dataset.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/io/npy_test_util.h"

namespace pipetrain::io {
namespace {

using ::pipetrain::testing::Bytes;
using ::pipetrain::testing::Npy;
using ::pipetrain::testing::WriteBytes;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/npy_dataset_" + name;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

// Features: row r is (r, r + 0.5); 10 rows.
std::string Features(int rows = 10, int columns = 2) {
  std::vector<float> v;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < columns; ++c) v.push_back(static_cast<float>(r) + 0.5f * c);
  }
  return Npy("<f4", absl::StrCat("(", rows, ", ", columns, ")"), Bytes(v));
}

std::vector<float> Sample(const Dataset& d, Split split, int64_t index, std::vector<float>* y) {
  std::vector<float> x(static_cast<size_t>(d.info().input_features));
  y->assign(static_cast<size_t>(d.info().target_features), 0.0f);
  d.GetSample(split, index, x.data(), y->data());
  return x;
}

TEST(NpyDatasetTest, ClassificationFromTwoFilesAndFromADirectory) {
  const std::string dir = Dir("classes");
  WriteBytes(dir + "/x.npy", Features());
  WriteBytes(dir + "/y.npy",
             Npy("<i8", "(10,)", Bytes(std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0, 1, 2, 4})));
  WriteBytes(dir + "/labels32.npy",
             Npy("<i4", "(10, 1)", Bytes(std::vector<int32_t>{0, 1, 2, 0, 1, 2, 0, 1, 2, 4})));
  for (const std::string& spec : {"npy:" + dir, "npy:" + dir + "/x.npy," + dir + "/y.npy",
                                  "npy:" + dir + "/x.npy," + dir + "/labels32.npy"}) {
    absl::StatusOr<std::unique_ptr<Dataset>> d = OpenDataset(spec, DatasetOptions());
    ASSERT_TRUE(d.ok()) << spec << ": " << d.status();
    const DatasetInfo& info = (*d)->info();
    EXPECT_EQ(info.name, spec);
    EXPECT_EQ(info.input_features, 2);
    EXPECT_EQ(info.target_features, 1);
    EXPECT_EQ(info.num_classes, 5);
    EXPECT_FALSE(info.token_ids);
    // The table rule: rows 4 and 9 held out.
    EXPECT_EQ((*d)->size(Split::kTrain), 8);
    EXPECT_EQ((*d)->size(Split::kEval), 2);
    std::vector<float> y;
    EXPECT_THAT(Sample(**d, Split::kTrain, 4, &y), ElementsAre(5.0f, 5.5f));
    EXPECT_THAT(y, ElementsAre(2.0f));
    EXPECT_THAT(Sample(**d, Split::kEval, 1, &y), ElementsAre(9.0f, 9.5f));
    EXPECT_THAT(y, ElementsAre(4.0f));
    // Label 4 (row 9) is beyond a 3-class model: named by file and row.
    absl::Status s = (*d)->CheckLabelsForModel(3);
    EXPECT_THAT(s.message(), HasSubstr(": row 9: class label 4 is out of range for the model, "
                                       "whose last layer outputs 3 classes (labels 0 to 2)"));
    EXPECT_TRUE((*d)->CheckLabelsForModel(5).ok());
  }
}

TEST(NpyDatasetTest, RegressionTargetsAreFloat32Columns) {
  const std::string dir = Dir("regression");
  WriteBytes(dir + "/x.npy", Npy("<f4", "(10,)", Bytes(std::vector<float>(10, 1.5f))));
  std::vector<float> targets;
  for (int i = 0; i < 30; ++i) targets.push_back(0.25f * static_cast<float>(i) - 1.0f);
  WriteBytes(dir + "/y.npy", Npy("<f4", "(10, 3)", Bytes(targets)));
  DatasetOptions o;
  o.regression_targets = 3;
  absl::StatusOr<std::unique_ptr<Dataset>> d = OpenDataset("npy:" + dir, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->info().input_features, 1);
  EXPECT_EQ((*d)->info().target_features, 3);
  EXPECT_EQ((*d)->info().num_classes, 0);
  std::vector<float> y;
  EXPECT_THAT(Sample(**d, Split::kEval, 0, &y), ElementsAre(1.5f));
  EXPECT_THAT(y, ElementsAre(2.0f, 2.25f, 2.5f));  // row 4
  EXPECT_TRUE((*d)->CheckLabelsForModel(1).ok());
}

void ExpectRefused(const std::string& spec, absl::StatusCode code, const std::string& message,
                   int64_t regression_targets = 0) {
  DatasetOptions o;
  o.regression_targets = regression_targets;
  absl::StatusOr<std::unique_ptr<Dataset>> d = OpenDataset(spec, o);
  EXPECT_EQ(d.status().code(), code) << spec << ": " << d.status();
  EXPECT_THAT(d.status().message(), HasSubstr(message)) << spec;
}

TEST(NpyDatasetTest, RefusesEveryMismatchNamingTheFile) {
  const std::string dir = Dir("bad");
  const std::string x = dir + "/x.npy";
  WriteBytes(x, Features());
  auto with_y = [&](const std::string& name, const std::string& bytes) {
    WriteBytes(dir + "/" + name, bytes);
    return "npy:" + x + "," + dir + "/" + name;
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  const std::string ten_labels = Bytes(std::vector<int64_t>(10, 1));
  // Dtypes.
  ExpectRefused(with_y("f8.npy", Npy("<f8", "(10,)", std::string(80, '\0'))), kInvalid,
                "f8.npy: class labels (the model's loss is softmax cross-entropy) must be int64 or "
                "int32, found float64 ('<f8'); for regression targets, train a model whose loss "
                "is mse");
  ExpectRefused(with_y("u8.npy", Npy("<u8", "(10,)", ten_labels)), kInvalid,
                "must be int64 or int32, found uint64 ('<u8')");
  ExpectRefused(with_y("i8.npy", Npy("<i8", "(10,)", ten_labels)), kInvalid,
                "i8.npy: targets must be float32 ('<f4'), found int64 ('<i8'); convert with "
                "a.astype(np.float32)",
                /*regression_targets=*/1);
  WriteBytes(dir + "/x64.npy", Npy("<f8", "(10, 1)", std::string(80, '\0')));
  WriteBytes(dir + "/y.npy", Npy("<i8", "(10,)", ten_labels));
  ExpectRefused("npy:" + dir + "/x64.npy," + dir + "/y.npy", kInvalid,
                "x64.npy: features must be float32 ('<f4'), found float64 ('<f8')");
  // Byte order, memory order, objects: the header parser's messages, with the file.
  ExpectRefused(with_y("big.npy", Npy(">i8", "(10,)", ten_labels)), kInvalid,
                "big.npy: dtype '>i8' is big-endian");
  ExpectRefused(with_y("fortran.npy", ::pipetrain::testing::NpyWithHeader(
                                          "{'descr': '<i8', 'fortran_order': True, "
                                          "'shape': (10, 1), }",
                                          ten_labels)),
                kInvalid, "fortran.npy: .npy header, byte");
  ExpectRefused(with_y("object.npy", Npy("|O", "(10,)", ten_labels)), kInvalid,
                "object.npy: dtype '|O' is an object array");
  // Shapes and counts.
  ExpectRefused(with_y("short.npy", Npy("<i8", "(9,)", Bytes(std::vector<int64_t>(9, 1)))),
                kInvalid, "x.npy has 10 rows but " + dir + "/short.npy has 9 (shape (9,))");
  ExpectRefused(with_y("wide.npy", Npy("<i8", "(10, 2)", Bytes(std::vector<int64_t>(20, 1)))),
                kInvalid, "class labels must have shape [rows] or [rows, 1], found (10, 2)");
  WriteBytes(dir + "/x3.npy", Npy("<f4", "(10, 1, 1)", Bytes(std::vector<float>(10, 1))));
  ExpectRefused("npy:" + dir + "/x3.npy," + dir + "/y.npy", kInvalid,
                "x3.npy: features must have shape [rows] or [rows, columns] with at least one of "
                "each, found (10, 1, 1)");
  WriteBytes(dir + "/x0.npy", Npy("<f4", "(0, 2)", ""));
  ExpectRefused("npy:" + dir + "/x0.npy," + dir + "/y.npy", kInvalid, "found (0, 2)");
  // Values.
  std::vector<int64_t> labels(10, 1);
  labels[6] = -3;
  ExpectRefused(with_y("negative.npy", Npy("<i8", "(10,)", Bytes(labels))), kInvalid,
                "negative.npy: row 6: class label -3 is negative");
  labels[6] = int64_t{1} << 24;
  ExpectRefused(with_y("huge.npy", Npy("<i8", "(10,)", Bytes(labels))), kInvalid,
                "huge.npy: row 6: class label 16777216 is larger than 16777215");
  std::vector<float> nan_targets(10, 0.0f);
  nan_targets[7] = std::numeric_limits<float>::quiet_NaN();
  ExpectRefused(with_y("nan.npy", Npy("<f4", "(10,)", Bytes(nan_targets))), kInvalid,
                "nan.npy: target at row 7, column 0 is nan, not a finite number", 1);
  std::vector<float> features(20, 0.0f);
  features[5] = std::numeric_limits<float>::infinity();
  WriteBytes(dir + "/xinf.npy", Npy("<f4", "(10, 2)", Bytes(features)));
  ExpectRefused("npy:" + dir + "/xinf.npy," + dir + "/y.npy", kInvalid,
                "xinf.npy: feature at row 2, column 1 is inf, not a finite number");
  // Spellings and files.
  ExpectRefused("npy:", kInvalid, "needs npy:FEATURES.npy,TARGETS.npy");
  ExpectRefused("npy:a,b,c", kInvalid, "for paths that contain ',' use the directory form");
  ExpectRefused("npy:a.npy,", kInvalid, "expected npy:FEATURES.npy,TARGETS.npy");
  ExpectRefused("npy:" + x, kInvalid, "is not a directory; expected npy:FEATURES.npy");
  ExpectRefused("npy:" + dir + "/none", absl::StatusCode::kNotFound, "none");
  ExpectRefused("npy:" + x + "," + dir + "/missing.npy", absl::StatusCode::kNotFound,
                "missing.npy");
  ExpectRefused("npy:" + dir + "," + dir + "/y.npy", kInvalid, "is a directory");
}

TEST(NpyDatasetTest, LimitsAreResourceExhausted) {
  const std::string dir = Dir("limits");
  WriteBytes(dir + "/x.npy", Features());
  WriteBytes(dir + "/y.npy", Npy("<i8", "(10,)", Bytes(std::vector<int64_t>(10, 0))));
  DatasetOptions o;
  o.max_samples = 9;
  absl::StatusOr<std::unique_ptr<Dataset>> d = OpenDataset("npy:" + dir, o);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kResourceExhausted) << d.status();
  EXPECT_THAT(d.status().message(), HasSubstr("10 rows: more than the limit of 9 samples"));
  o = DatasetOptions();
  o.max_file_bytes = 100;
  d = OpenDataset("npy:" + dir, o);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kResourceExhausted) << d.status();
}

}  // namespace
}  // namespace pipetrain::io
