#include "common/io/npy_dataset.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/io/file_util.h"
#include "common/io/npy.h"
#include "common/io/scoped_fd.h"
#include "common/io/table_dataset.h"
#include "common/util/status_macros.h"

namespace pipetrain::io {
namespace {

// The spelling of the spec, for messages.
constexpr char kSpelling[] =
    "npy:FEATURES.npy,TARGETS.npy (two paths, one comma) or npy:DIR (a directory holding x.npy "
    "and y.npy)";

struct NpyPaths {
  std::string features;
  std::string targets;
};

absl::StatusOr<NpyPaths> SplitNpySpec(absl::string_view arg) {
  if (arg.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("dataset spec 'npy:': needs ", kSpelling));
  }
  const size_t comma = arg.find(',');
  if (comma != absl::string_view::npos) {
    if (arg.find(',', comma + 1) != absl::string_view::npos || comma == 0 ||
        comma + 1 == arg.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset spec 'npy:", arg, "': expected ", kSpelling,
                       "; for paths that contain ',' use the directory form"));
    }
    return NpyPaths{std::string(arg.substr(0, comma)), std::string(arg.substr(comma + 1))};
  }
  const std::string dir(arg);
  PT_RETURN_IF_ERROR(CheckNoNulByte(dir));
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return ErrnoError(errno, "npy data set: cannot read", dir);
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("dataset spec 'npy:", arg, "': '", dir,
                                                   "' is not a directory; expected ", kSpelling));
  }
  return NpyPaths{JoinPath(dir, "x.npy"), JoinPath(dir, "y.npy")};
}

std::string ShapeText(const NpyHeader& h) {
  return absl::StrCat("(", absl::StrJoin(h.shape, ", "), h.shape.size() == 1 ? ",)" : ")");
}

// Checks `f` (named `path`) is float32 of shape [rows] or [rows, columns >= 1] and returns its
// values, every one finite (`what` names them in messages: "feature", "target").
absl::StatusOr<std::vector<float>> FloatMatrix(const NpyFile& f, const std::string& path,
                                               absl::string_view what, int64_t* columns) {
  const NpyHeader& h = f.header;
  if (h.kind != 'f' || h.item_bytes != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", what, "s must be float32 ('<f4'), found ", NpyDtypeName(h), " ('",
                     h.descr, "'); convert with a.astype(np.float32)"));
  }
  if (h.shape.empty() || h.shape.size() > 2 || h.shape[0] < 1 ||
      (h.shape.size() == 2 && h.shape[1] < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", what,
        "s must have shape [rows] or [rows, columns] with at least one of each, found ",
        ShapeText(h)));
  }
  *columns = h.shape.size() == 2 ? h.shape[1] : 1;
  std::vector<float> values(static_cast<size_t>(h.elements));
  std::memcpy(values.data(), f.bytes.data() + h.data_offset, values.size() * sizeof(float));
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isfinite(values[i])) continue;
    const int64_t index = static_cast<int64_t>(i);
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what, " at row ", index / *columns,
                                                   ", column ", index % *columns, " is ", values[i],
                                                   ", not a finite number"));
  }
  return values;
}

// Reads the class labels of `f` (named `path`): int64 or int32 of shape [rows] or [rows, 1], each
// in [0, kMaxClassLabel), into `t`.
absl::Status ReadLabels(const NpyFile& f, const std::string& path, Table& t) {
  const NpyHeader& h = f.header;
  if (h.kind != 'i' || (h.item_bytes != 8 && h.item_bytes != 4)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path,
        ": class labels (the model's loss is softmax cross-entropy) must be int64 or int32, "
        "found ",
        NpyDtypeName(h), " ('", h.descr, "')",
        h.kind == 'f' ? "; for regression targets, train a model whose loss is mse" : ""));
  }
  if (h.shape.empty() || h.shape.size() > 2 || (h.shape.size() == 2 && h.shape[1] != 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": class labels must have shape [rows] or [rows, 1], found ", ShapeText(h)));
  }
  t.targets.resize(static_cast<size_t>(h.shape[0]));
  const char* data = f.bytes.data() + h.data_offset;
  for (int64_t r = 0; r < h.shape[0]; ++r) {
    int64_t label;
    if (h.item_bytes == 8) {
      std::memcpy(&label, data + 8 * r, 8);
    } else {
      int32_t v;
      std::memcpy(&v, data + 4 * r, 4);
      label = v;
    }
    if (label < 0 || label >= kMaxClassLabel) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": row ", r, ": class label ", label,
                       label < 0 ? " is negative" : " is larger than ",
                       label < 0 ? "" : absl::StrCat(kMaxClassLabel - 1)));
    }
    t.targets[static_cast<size_t>(r)] = static_cast<float>(label);
    t.first_line_of_label.emplace(label, r);
    t.num_classes = std::max(t.num_classes, label + 1);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> OpenNpyDataset(absl::string_view arg,
                                                        const DatasetOptions& options) {
  PT_ASSIGN_OR_RETURN(NpyPaths paths, SplitNpySpec(arg));
  PT_ASSIGN_OR_RETURN(NpyFile x, ReadNpyFile(paths.features, options.max_file_bytes));
  const int64_t rows = x.header.shape.empty() ? 0 : x.header.shape[0];
  if (rows > options.max_samples) {
    return absl::ResourceExhaustedError(
        absl::StrCat(paths.features, ": ", rows, " rows: more than the limit of ",
                     options.max_samples, " samples (DatasetOptions::max_samples)"));
  }
  Table t;
  PT_ASSIGN_OR_RETURN(t.values, FloatMatrix(x, paths.features, "feature", &t.features));
  x.bytes.clear();
  x.bytes.shrink_to_fit();
  PT_ASSIGN_OR_RETURN(NpyFile y, ReadNpyFile(paths.targets, options.max_file_bytes));
  const int64_t target_rows = y.header.shape.empty() ? 0 : y.header.shape[0];
  if (target_rows != rows) {
    return absl::InvalidArgumentError(absl::StrCat(paths.features, " has ", rows, " rows but ",
                                                   paths.targets, " has ", target_rows, " (shape ",
                                                   ShapeText(y.header), ")"));
  }
  if (options.regression_targets > 0) {
    PT_ASSIGN_OR_RETURN(t.targets, FloatMatrix(y, paths.targets, "target", &t.target_features));
  } else {
    PT_RETURN_IF_ERROR(ReadLabels(y, paths.targets, t));
  }
  t.rows = rows;
  t.file = paths.targets;
  t.location = RowLocation::kNpyRow;
  return MakeTableDataset(absl::StrCat("npy:", arg), std::move(t));
}

}  // namespace pipetrain::io
