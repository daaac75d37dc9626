// A table data set: one sample per row of features and targets (class labels or regression
// targets), held out by the fixed table rule (every 5th row). Built by the digits, csv: and npy:
// readers (common/io/dataset.cc, common/io/npy_dataset.cc); internal to common/io.
#ifndef PIPETRAIN_COMMON_IO_TABLE_DATASET_H_
#define PIPETRAIN_COMMON_IO_TABLE_DATASET_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/io/dataset.h"

namespace pipetrain::io {

// Table data sets hold out every 5th row (rows 4, 9, 14, ...): 20%, independent of any seed.
inline constexpr int64_t kHoldOutPeriod = 5;

// Where CheckLabelsForModel says a row is: "FILE:LINE:COLUMN" of a CSV file, or "FILE: row R"
// of an npy: labels file.
enum class RowLocation { kCsvLine, kNpyRow };

struct Table {
  std::string file;  // the file the targets were read from, for messages.
  RowLocation location = RowLocation::kCsvLine;
  int64_t rows = 0;
  int64_t features = 0;
  int64_t target_features = 1;  // 1 for class labels; the targets per row for regression.
  int64_t num_classes = 0;      // largest label + 1; 0 for regression targets.
  std::vector<float> values;    // rows x features, row-major
  std::vector<float> targets;   // rows x target_features, row-major
  // Class labels only: the line (kCsvLine) or row (kNpyRow) on which each label value first
  // occurs: enough to name the first row of the file whose label is beyond any bound, at one
  // entry per distinct label instead of one per row.
  std::map<int64_t, int64_t> first_line_of_label;
};

// Rows of a table of `rows` rows in `split` (the eval split is rows / kHoldOutPeriod).
int64_t TableSplitSize(int64_t rows, Split split);

// Row of the table that is sample `index` of `split`: eval sample k is row 5k + 4, train sample j
// is row (j / 4) * 5 + j % 4.
int64_t TableRow(Split split, int64_t index);

// The data set over `table` named `name` (DatasetInfo::name). Regression targets
// (num_classes 0) have no labels to check: CheckLabelsForModel is OK for them.
std::unique_ptr<Dataset> MakeTableDataset(std::string name, Table table);

// The tail of every CheckLabelsForModel message, with the fix: " is out of range for the model,
// whose last layer outputs N classes (<unit> 0 to N-1); the data set has D: set the last linear
// layer's out_features to D, or to 0 to take the data set's" (D: `data_classes`).
std::string OutOfRangeForModel(int64_t model_classes, absl::string_view unit, int64_t data_classes);

// Aborts naming the data set, the split and the index: GetSample with an index out of range is a
// programming error, not a data error.
[[noreturn]] void DieBadIndex(const DatasetInfo& info, Split split, int64_t index, int64_t size);

}  // namespace pipetrain::io

#endif  // PIPETRAIN_COMMON_IO_TABLE_DATASET_H_
