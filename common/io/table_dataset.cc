#include "common/io/table_dataset.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pipetrain::io {
namespace {

class TableDataset : public Dataset {
 public:
  TableDataset(std::string name, Table table) : table_(std::move(table)) {
    info_.name = std::move(name);
    info_.input_features = table_.features;
    info_.target_features = table_.target_features;
    info_.tokens_per_sample = 1;
    info_.num_classes = table_.num_classes;
  }

  const DatasetInfo& info() const override { return info_; }
  int64_t size(Split split) const override { return TableSplitSize(table_.rows, split); }

  void GetSample(Split split, int64_t index, float* inputs, float* targets) const override {
    if (index < 0 || index >= size(split)) DieBadIndex(info_, split, index, size(split));
    const int64_t row = TableRow(split, index);
    const float* src = table_.values.data() + row * table_.features;
    std::copy(src, src + table_.features, inputs);
    const float* target = table_.targets.data() + row * table_.target_features;
    std::copy(target, target + table_.target_features, targets);
  }

  absl::Status CheckLabelsForModel(int64_t model_classes) const override {
    if (table_.num_classes <= model_classes) return absl::OkStatus();
    // The first line (in file order) of any label beyond the model's classes.
    int64_t label = -1;
    int64_t line = 0;
    for (auto it = table_.first_line_of_label.lower_bound(std::max<int64_t>(model_classes, 0));
         it != table_.first_line_of_label.end(); ++it) {
      if (label < 0 || it->second < line) {
        label = it->first;
        line = it->second;
      }
    }
    const std::string where = table_.location == RowLocation::kCsvLine
                                  ? absl::StrCat(table_.file, ":", line, ":", table_.features + 1)
                                  : absl::StrCat(table_.file, ": row ", line);
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": class label ", label,
                     OutOfRangeForModel(model_classes, "labels", table_.num_classes)));
  }

 private:
  DatasetInfo info_;
  Table table_;
};

}  // namespace

int64_t TableSplitSize(int64_t rows, Split split) {
  const int64_t eval = rows / kHoldOutPeriod;
  return split == Split::kEval ? eval : rows - eval;
}

int64_t TableRow(Split split, int64_t index) {
  if (split == Split::kEval) return index * kHoldOutPeriod + (kHoldOutPeriod - 1);
  return (index / (kHoldOutPeriod - 1)) * kHoldOutPeriod + index % (kHoldOutPeriod - 1);
}

std::unique_ptr<Dataset> MakeTableDataset(std::string name, Table table) {
  return std::make_unique<TableDataset>(std::move(name), std::move(table));
}

std::string OutOfRangeForModel(int64_t model_classes, absl::string_view unit,
                               int64_t data_classes) {
  return absl::StrCat(" is out of range for the model, whose last layer outputs ", model_classes,
                      " classes (", unit, " 0 to ", model_classes - 1, "); the data set has ",
                      data_classes, ": set the last linear layer's out_features to ", data_classes,
                      ", or to 0 to take the data set's");
}

void DieBadIndex(const DatasetInfo& info, Split split, int64_t index, int64_t size) {
  std::fprintf(stderr, "pipetrain: dataset %s: %s sample index %lld out of range [0, %lld)\n",
               info.name.c_str(), split == Split::kTrain ? "train" : "eval",
               static_cast<long long>(index), static_cast<long long>(size));
  std::abort();
}

}  // namespace pipetrain::io
