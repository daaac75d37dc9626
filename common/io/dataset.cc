#include "common/io/dataset.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/io/file_util.h"
#include "common/io/input_file.h"
#include "common/io/npy_dataset.h"
#include "common/io/table_dataset.h"
#include "common/io/token_corpus.h"
#include "common/io/token_text_dataset.h"
#include "common/util/checked_math.h"
#include "common/util/decimal_number.h"
#include "common/util/status_macros.h"

namespace pipetrain::io {
namespace {

// Names of the bundled files inside DatasetOptions::data_dir.
constexpr char kDigitsFile[] = "digits.csv.gz";
constexpr char kTextFile[] = "gpl-3.txt";

// Shape of the bundled digits data.
constexpr int64_t kDigitsRows = 1797;
constexpr int64_t kDigitsFeatures = 64;
constexpr int64_t kDigitsClasses = 10;

// Text datasets hold out the last 1/kTextHoldOutDivisor of the text.
constexpr int64_t kTextHoldOutDivisor = 10;

absl::Status CsvError(absl::string_view file, int64_t line, int64_t column,
                      absl::string_view what) {
  return absl::InvalidArgumentError(column > 0
                                        ? absl::StrCat(file, ":", line, ":", column, ": ", what)
                                        : absl::StrCat(file, ":", line, ": ", what));
}

std::string Shorten(absl::string_view field) {
  if (field.size() <= 40) return std::string(field);
  return absl::StrCat(field.substr(0, 40), "...");
}

// Reads a data file under options.max_file_bytes (decompressed if gzip-compressed).
absl::StatusOr<std::string> ReadDataFile(const std::string& path, const DatasetOptions& options) {
  return ReadInputFile("data file", path, options.max_file_bytes, InputCompression::kGzipDetected);
}

// ReadDataFile for a file of the bundled data directory; a NOT_FOUND says how to point at it.
absl::StatusOr<std::string> ReadBundledFile(const std::string& path,
                                            const DatasetOptions& options) {
  absl::StatusOr<std::string> content = ReadDataFile(path, options);
  if (content.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(absl::StrCat(content.status().message(),
                                            " (the bundled data directory; pass --data-dir DIR or "
                                            "set $",
                                            kDataDirEnv, ")"));
  }
  return content;
}

// RESOURCE_EXHAUSTED "<what>: more than the limit of <limit> samples
// (DatasetOptions::max_samples)".
absl::Status TooManySamples(absl::string_view what, int64_t limit) {
  return absl::ResourceExhaustedError(absl::StrCat(what, ": more than the limit of ", limit,
                                                   " samples (DatasetOptions::max_samples)"));
}

// Parses the feature or regression target `field` at `line`:`column` as a finite decimal float.
absl::StatusOr<float> ParseCsvNumber(absl::string_view field, absl::string_view file, int64_t line,
                                     int64_t column, absl::string_view what) {
  float v;
  if (!absl::SimpleAtof(field, &v)) {
    return CsvError(file, line, column,
                    absl::StrCat(what, "'", Shorten(field), "' is not a number"));
  }
  // SimpleAtof also reads "inf", "nan" and hexadecimal ("0x10"); the format is decimal.
  if (!std::isfinite(v)) {
    return CsvError(file, line, column,
                    absl::StrCat(what, "'", Shorten(field), "' is not a finite number"));
  }
  if (!util::IsDecimalNumber(field)) {
    return CsvError(file, line, column,
                    absl::StrCat(what, "'", Shorten(field), "' is not a decimal number"));
  }
  return v;
}

// Parses the class label `text` at `line`:`column`: a decimal integer in [0, kMaxClassLabel).
absl::StatusOr<int64_t> ParseCsvLabel(absl::string_view text, absl::string_view file, int64_t line,
                                      int64_t column) {
  auto error = [&](absl::string_view what) {
    return CsvError(file, line, column, absl::StrCat("class label '", Shorten(text), "' ", what));
  };
  double label;
  if (!absl::SimpleAtod(text, &label) || !std::isfinite(label)) return error("is not a number");
  if (!util::IsDecimalNumber(text)) return error("is not a decimal number");
  if (label < 0) return error("is negative");
  if (label != std::floor(label)) {
    return error("is not an integer (for regression targets, train a model whose loss is mse)");
  }
  if (label >= kMaxClassLabel) {
    return error(absl::StrCat("is larger than ", kMaxClassLabel - 1));
  }
  return static_cast<int64_t>(label);
}

// Parses the data row `fields` at `line` into `t`: feature columns, then one class label
// (`regression_targets` 0) or `regression_targets` target columns.
absl::Status ParseCsvRow(const std::vector<absl::string_view>& fields, absl::string_view file,
                         int64_t line, int64_t regression_targets, Table& t) {
  const int64_t n = static_cast<int64_t>(fields.size());
  const int64_t first_target = n - std::max<int64_t>(regression_targets, 1);
  for (int64_t c = 0; c < n; ++c) {
    const absl::string_view field = fields[static_cast<size_t>(c)];
    if (c < first_target || regression_targets > 0) {
      PT_ASSIGN_OR_RETURN(
          float v, ParseCsvNumber(field, file, line, c + 1, c < first_target ? "" : "target "));
      (c < first_target ? t.values : t.targets).push_back(v);
      continue;
    }
    PT_ASSIGN_OR_RETURN(int64_t label, ParseCsvLabel(field, file, line, n));
    t.targets.push_back(static_cast<float>(label));
    t.first_line_of_label.emplace(label, line);
    t.num_classes = std::max(t.num_classes, label + 1);
  }
  ++t.rows;
  return absl::OkStatus();
}

// What a CSV row needs, for the message about a row or header with too few columns.
std::string ColumnsNeeded(int64_t regression_targets) {
  if (regression_targets == 0) return "need at least one feature column and a label";
  return absl::StrCat("need at least one feature column and the model's ", regression_targets,
                      " regression target column", regression_targets > 1 ? "s" : "");
}

// Parses CSV `content` (named `file` in messages): numeric feature columns, then an integer class
// label >= 0 (`regression_targets` 0), or then `regression_targets` numeric target columns; an
// optional first line of names; blank lines ignored; no quoting. At most `max_rows` data rows
// (RESOURCE_EXHAUSTED beyond).
absl::StatusOr<Table> ParseCsv(absl::string_view content, absl::string_view file, int64_t max_rows,
                               int64_t regression_targets = 0) {
  Table t;
  t.target_features = std::max<int64_t>(regression_targets, 1);
  const int64_t min_columns = t.target_features + 1;
  const std::string need = ColumnsNeeded(regression_targets);
  int64_t columns = 0;  // expected per row, fixed by the header or the first data row
  int64_t first_row_line = 0;
  bool seen_first_line = false;
  int64_t line_no = 0;
  std::vector<absl::string_view> fields;
  for (absl::string_view line : absl::StrSplit(content, '\n')) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    fields = absl::StrSplit(line, ',');
    const int64_t n = static_cast<int64_t>(fields.size());
    if (!seen_first_line) {
      seen_first_line = true;
      bool any_number = false;
      for (absl::string_view f : fields) any_number |= util::IsDecimalNumber(f);
      if (!any_number) {  // a header of column names
        if (n < min_columns) {
          return CsvError(file, line_no, 0,
                          absl::StrCat("header has ", n, " column", n > 1 ? "s" : "", "; ", need));
        }
        columns = n;
        continue;
      }
    }
    if (columns == 0) {
      if (n < min_columns) {
        return CsvError(file, line_no, 0,
                        absl::StrCat("row has ", n, " column", n > 1 ? "s" : "", "; ", need));
      }
      columns = n;
      first_row_line = line_no;
    }
    if (n != columns) {
      return CsvError(
          file, line_no, 0,
          absl::StrCat("row has ", n, " columns but ",
                       first_row_line > 0 ? absl::StrCat("line ", first_row_line, " has ")
                                          : std::string("the header has "),
                       columns));
    }
    if (first_row_line == 0) first_row_line = line_no;
    if (t.rows == max_rows) {
      return TooManySamples(absl::StrCat(file, ":", line_no, ": data row ", max_rows + 1),
                            max_rows);
    }
    PT_RETURN_IF_ERROR(ParseCsvRow(fields, file, line_no, regression_targets, t));
  }
  if (t.rows == 0) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": no data rows"));
  }
  t.features = columns - t.target_features;
  t.file = std::string(file);
  return t;
}

// ----- Text --------------------------------------------------------------------------------

class TextDataset : public Dataset {
 public:
  TextDataset(std::string name, std::string path, const std::string& text, int64_t context)
      : path_(std::move(path)), context_(context) {
    std::array<bool, 256> present{};
    for (char c : text) present[static_cast<unsigned char>(c)] = true;
    std::array<uint8_t, 256> id{};
    for (int b = 0; b < 256; ++b) {
      if (!present[static_cast<size_t>(b)]) continue;
      id[static_cast<size_t>(b)] = static_cast<uint8_t>(info_.vocabulary.size());
      info_.vocabulary.push_back(static_cast<char>(b));
    }
    ids_.reserve(text.size());
    for (char c : text) ids_.push_back(id[static_cast<unsigned char>(c)]);
    const int64_t length = static_cast<int64_t>(text.size());
    split_ = length - length / kTextHoldOutDivisor;
    info_.name = std::move(name);
    info_.input_features = 1;
    info_.target_features = 1;
    info_.tokens_per_sample = context;
    info_.num_classes = static_cast<int64_t>(info_.vocabulary.size());
    info_.token_ids = true;
  }

  const DatasetInfo& info() const override { return info_; }

  int64_t size(Split split) const override {
    // A window needs context + 1 characters inside its part of the text.
    const int64_t part =
        split == Split::kTrain ? split_ : static_cast<int64_t>(ids_.size()) - split_;
    return std::max<int64_t>(0, part - context_);
  }

  void GetSample(Split split, int64_t index, float* inputs, float* targets) const override {
    if (index < 0 || index >= size(split)) DieBadIndex(info_, split, index, size(split));
    const uint8_t* p = ids_.data() + (split == Split::kTrain ? 0 : split_) + index;
    for (int64_t t = 0; t < context_; ++t) {
      inputs[t] = static_cast<float>(p[t]);
      targets[t] = static_cast<float>(p[t + 1]);
    }
  }

  // First byte of the held-out part.
  int64_t split_point() const { return split_; }

  absl::Status CheckLabelsForModel(int64_t model_classes) const override {
    if (info_.num_classes <= model_classes) return absl::OkStatus();
    // The targets are the bytes after the first of each part that has a window.
    const int64_t length = static_cast<int64_t>(ids_.size());
    for (const auto& [begin, end, split] :
         {std::tuple<int64_t, int64_t, Split>{0, split_, Split::kTrain},
          std::tuple<int64_t, int64_t, Split>{split_, length, Split::kEval}}) {
      if (size(split) == 0) continue;
      for (int64_t x = begin + 1; x < end; ++x) {
        const int64_t id = ids_[static_cast<size_t>(x)];
        if (id < model_classes) continue;
        const char byte = info_.vocabulary[static_cast<size_t>(id)];
        return absl::InvalidArgumentError(absl::StrCat(
            path_, ": byte ", x, " ('", absl::CHexEscape(absl::string_view(&byte, 1)), "', token ",
            id, ")", OutOfRangeForModel(model_classes, "tokens", info_.num_classes)));
      }
    }
    return absl::OkStatus();
  }

 private:
  DatasetInfo info_;
  std::string path_;
  int64_t context_;
  int64_t split_ = 0;
  std::vector<uint8_t> ids_;
};

// ----- Synthetic ---------------------------------------------------------------------------

uint64_t Mix64(uint64_t x) {  // SplitMix64 step: a bijective, well-mixed hash
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

constexpr double kPi = 3.14159265358979323846;

// A N(0, 1) draw that depends only on (seed, domain, row, column): Box-Muller on two counter-based
// uniforms, computed in double and rounded to float.
float CounterGaussian(uint64_t seed, uint64_t domain, uint64_t row, uint64_t column) {
  const uint64_t base = Mix64(Mix64(Mix64(seed) ^ domain) + row);
  const uint64_t pair = column / 2;
  const uint64_t a = Mix64(base + 2 * pair);
  const uint64_t b = Mix64(base + 2 * pair + 1);
  const double u1 = 1.0 - static_cast<double>(a >> 11) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;        // [0, 1)
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double angle = 2.0 * kPi * u2;
  return static_cast<float>(column % 2 == 0 ? r * std::cos(angle) : r * std::sin(angle));
}

constexpr uint64_t kFeatureDomain = 0x66656174ull;  // "feat"
constexpr uint64_t kTeacherDomain = 0x74656163ull;  // "teac"

class SyntheticDataset : public Dataset {
 public:
  SyntheticDataset(int64_t rows, int64_t features, int64_t classes, uint64_t seed)
      : rows_(rows), seed_(seed) {
    info_.name = absl::StrCat("synthetic:", rows);
    info_.input_features = features;
    info_.target_features = 1;
    info_.tokens_per_sample = 1;
    info_.num_classes = classes;
    teacher_.resize(static_cast<size_t>(classes * features));
    for (int64_t c = 0; c < classes; ++c) {
      for (int64_t f = 0; f < features; ++f) {
        teacher_[static_cast<size_t>(c * features + f)] = CounterGaussian(
            seed, kTeacherDomain, static_cast<uint64_t>(c), static_cast<uint64_t>(f));
      }
    }
    // A row costs `features` Gaussians and `classes` x `features` products to compute (~1 ms per
    // batch of 256 x 256, more than a pipeline's whole gap between two steps) and a copy to read:
    // a table that fits in kMaterializedBytes is computed once, here.
    if (rows * (features + 1) <= kMaterializedBytes / static_cast<int64_t>(sizeof(float))) {
      materialized_.resize(static_cast<size_t>(rows * (features + 1)));
      for (int64_t r = 0; r < rows; ++r) {
        float* row = materialized_.data() + r * (features + 1);
        ComputeRow(static_cast<uint64_t>(r), row, row + features);
      }
    }
  }

  const DatasetInfo& info() const override { return info_; }
  int64_t size(Split split) const override { return TableSplitSize(rows_, split); }

  void GetSample(Split split, int64_t index, float* inputs, float* targets) const override {
    if (index < 0 || index >= size(split)) DieBadIndex(info_, split, index, size(split));
    const int64_t row = TableRow(split, index);
    const int64_t features = info_.input_features;
    if (materialized_.empty()) return ComputeRow(static_cast<uint64_t>(row), inputs, targets);
    const float* src = materialized_.data() + row * (features + 1);
    std::copy(src, src + features, inputs);
    targets[0] = src[features];
  }

 private:
  // Tables up to this size are computed when the data set is opened (4 MiB for the default 4096
  // rows of 256 features).
  static constexpr int64_t kMaterializedBytes = int64_t{16} << 20;

  // The features and the teacher's label of `row`: a function of (seed, row) only.
  void ComputeRow(uint64_t row, float* inputs, float* targets) const {
    const int64_t features = info_.input_features;
    for (int64_t f = 0; f < features; ++f) {
      inputs[f] = CounterGaussian(seed_, kFeatureDomain, row, static_cast<uint64_t>(f));
    }
    int64_t best = 0;
    double best_score = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < info_.num_classes; ++c) {
      const float* w = teacher_.data() + c * features;
      double score = 0;
      for (int64_t f = 0; f < features; ++f) score += static_cast<double>(w[f]) * inputs[f];
      if (score > best_score) {
        best_score = score;
        best = c;
      }
    }
    targets[0] = static_cast<float>(best);
  }

  DatasetInfo info_;
  int64_t rows_;
  uint64_t seed_;
  std::vector<float> teacher_;       // num_classes x input_features
  std::vector<float> materialized_;  // rows x (input_features + 1: the label), or empty.
};

// ----- Opening -----------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Dataset>> OpenDigits(const DatasetOptions& options) {
  const std::string path = JoinPath(options.data_dir, kDigitsFile);
  PT_ASSIGN_OR_RETURN(std::string content, ReadBundledFile(path, options));
  absl::StatusOr<Table> table = ParseCsv(content, path, options.max_samples);
  if (!table.ok()) {
    return absl::DataLossError(
        absl::StrCat("bundled digits data is corrupt: ", table.status().message()));
  }
  if (table->rows != kDigitsRows || table->features != kDigitsFeatures ||
      table->num_classes != kDigitsClasses) {
    return absl::DataLossError(absl::StrCat(path, ": bundled digits data has ", table->rows,
                                            " rows, ", table->features, " features and ",
                                            table->num_classes, " classes; expected ", kDigitsRows,
                                            ", ", kDigitsFeatures, " and ", kDigitsClasses));
  }
  for (float& v : table->values) {
    if (v < 0 || v > 16) {
      return absl::DataLossError(
          absl::StrCat(path, ": bundled digits pixel value ", v, " outside [0, 16]"));
    }
    v /= 16.0f;  // exact: a power of two
  }
  return MakeTableDataset("digits", *std::move(table));
}

absl::StatusOr<std::unique_ptr<Dataset>> OpenCsv(const std::string& path,
                                                 const DatasetOptions& options) {
  PT_ASSIGN_OR_RETURN(std::string content, ReadDataFile(path, options));
  PT_ASSIGN_OR_RETURN(Table table,
                      ParseCsv(content, path, options.max_samples, options.regression_targets));
  return MakeTableDataset(absl::StrCat("csv:", path), std::move(table));
}

absl::StatusOr<std::unique_ptr<Dataset>> OpenText(const std::string& name, const std::string& path,
                                                  const DatasetOptions& options) {
  if (options.context == 0) {
    // The context comes from the model's embedding: a model without one cannot read text.
    return absl::InvalidArgumentError(absl::StrCat(
        "data set ", name,
        " is text, token ids for a model whose first layer is an embedding "
        "(its context is the tokens per sample), and the model has none: use a token model (e.g. "
        "examples/gpt_char.textproto), or a data set of feature rows for this one (digits, "
        "csv:PATH)"));
  }
  if (options.context < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset ", name, ": context must be > 0 for a text dataset, got ", options.context));
  }
  // Bounded first, so that context + 1 below (and the windows' arithmetic) cannot overflow.
  if (options.context > kMaxTextContext) {
    return absl::InvalidArgumentError(absl::StrCat("dataset ", name, ": context ", options.context,
                                                   " is out of range [1, ", kMaxTextContext,
                                                   "] (the largest context of a model)"));
  }
  // The bundled text ("text" without a path) lives in the data directory.
  PT_ASSIGN_OR_RETURN(std::string text, name == "text" ? ReadBundledFile(path, options)
                                                       : ReadDataFile(path, options));
  if (text.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": text is empty"));
  if (options.tokenizer != nullptr) {
    return OpenTokenText(name, path, text, options.context, options.tokenizer, options);
  }
  auto dataset = std::make_unique<TextDataset>(name, path, text, options.context);
  const int64_t samples = dataset->size(Split::kTrain) + dataset->size(Split::kEval);
  if (samples > options.max_samples) {
    return TooManySamples(absl::StrCat(path, ": text of ", text.size(), " bytes has ", samples,
                                       " windows (one per byte)"),
                          options.max_samples);
  }
  if (dataset->size(Split::kTrain) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": text of ", text.size(), " bytes is too short for context ",
                     options.context, ": the training part (first ", dataset->split_point(),
                     " bytes) needs at least ", options.context + 1));
  }
  return std::unique_ptr<Dataset>(std::move(dataset));
}

absl::StatusOr<std::unique_ptr<Dataset>> OpenSynthetic(absl::string_view rows_text,
                                                       const DatasetOptions& options) {
  int64_t rows = options.synthetic_rows;
  if (!rows_text.empty() && !absl::SimpleAtoi(rows_text, &rows)) {
    if (std::all_of(rows_text.begin(), rows_text.end(), absl::ascii_isdigit)) {
      return TooManySamples(
          absl::StrCat("synthetic dataset: row count ", rows_text, " (beyond 64 bits)"),
          options.max_samples);
    }
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic dataset: row count '", rows_text, "' is not an integer"));
  }
  if (rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic dataset: row count must be >= 1, got ", rows));
  }
  if (rows > options.max_samples) {
    return TooManySamples(absl::StrCat("synthetic dataset: row count ", rows), options.max_samples);
  }
  if (options.input_features < 1 || options.num_classes < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "synthetic dataset: needs input_features >= 1 and num_classes >= 2 (from the model), got ",
        options.input_features, " and ", options.num_classes));
  }
  constexpr int64_t kMaxTeacher = int64_t{1} << 28;
  if (options.input_features > kMaxTeacher || options.num_classes > kMaxTeacher ||
      options.input_features * options.num_classes > kMaxTeacher) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic dataset: input_features x num_classes = ", options.input_features,
                     " x ", options.num_classes, " exceeds the limit of ", kMaxTeacher));
  }
  return std::unique_ptr<Dataset>(
      new SyntheticDataset(rows, options.input_features, options.num_classes, options.seed));
}

// An unbiased draw from [0, bound), bound >= 1, by rejection on the smallest covering bit mask.
uint64_t BoundedDraw(std::mt19937_64& gen, uint64_t bound) {
  if (bound <= 1) return 0;
  const uint64_t mask = ~uint64_t{0} >> __builtin_clzll(bound - 1);
  while (true) {
    const uint64_t x = gen() & mask;
    if (x < bound) return x;
  }
}

absl::StatusOr<std::unique_ptr<Dataset>> OpenDatasetUnguarded(absl::string_view spec,
                                                              const DatasetOptions& options) {
  const size_t colon = spec.find(':');
  const absl::string_view kind = spec.substr(0, colon);
  const bool has_arg = colon != absl::string_view::npos;
  const absl::string_view arg = has_arg ? spec.substr(colon + 1) : absl::string_view();
  if (kind == "digits") {
    if (has_arg) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset spec '", spec, "': digits takes no argument"));
    }
    return OpenDigits(options);
  }
  if (kind == "text") {
    if (has_arg && arg.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset spec '", spec, "': text: needs a path"));
    }
    if (!has_arg) return OpenText("text", JoinPath(options.data_dir, kTextFile), options);
    return OpenText(absl::StrCat("text:", arg), std::string(arg), options);
  }
  if (kind == "csv") {
    if (arg.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset spec '", spec, "': csv needs a path (csv:PATH)"));
    }
    return OpenCsv(std::string(arg), options);
  }
  if (kind == "npy") return OpenNpyDataset(arg, options);
  if (kind == "tokens") return OpenTokenCorpus(arg, options);
  if (kind == "synthetic") {
    if (has_arg && arg.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset spec '", spec, "': synthetic: needs a row count"));
    }
    return OpenSynthetic(arg, options);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dataset spec '", spec,
      "' (expected digits, text, text:PATH, csv:PATH, npy:FEATURES.npy,TARGETS.npy, npy:DIR, "
      "tokens:PATH[:uint16|:uint32], synthetic or synthetic:ROWS)"));
}

}  // namespace

Dataset::~Dataset() = default;

absl::Status Dataset::CheckLabelsForModel(int64_t model_classes) const {
  const DatasetInfo& i = info();
  // Every data set's targets are below its num_classes.
  if (i.num_classes <= model_classes) return absl::OkStatus();
  const int64_t rows = i.tokens_per_sample;
  std::vector<float> inputs(static_cast<size_t>(rows * i.input_features));
  std::vector<float> targets(static_cast<size_t>(rows * i.target_features));
  for (Split split : {Split::kTrain, Split::kEval}) {
    for (int64_t index = 0; index < size(split); ++index) {
      GetSample(split, index, inputs.data(), targets.data());
      for (float t : targets) {
        if (t < static_cast<float>(model_classes)) continue;
        return absl::InvalidArgumentError(absl::StrCat(
            "data set ", i.name, ": ", split == Split::kTrain ? "training" : "held-out", " sample ",
            index, " has class label ", static_cast<int64_t>(t), ", which",
            OutOfRangeForModel(model_classes, "labels", i.num_classes)));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(absl::string_view spec,
                                                     const DatasetOptions& options) {
  if (options.tokenizer != nullptr && spec != "text" && spec.substr(0, 5) != "text:") {
    return absl::InvalidArgumentError(absl::StrCat(
        "a tokenizer applies to text data sets (text, text:PATH), not to '", spec, "'"));
  }
  // DatasetOptions' limits bound every allocation; this is the last line of defence when the
  // machine has less memory than they allow.
  try {
    return OpenDatasetUnguarded(spec, options);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("dataset '", spec, "': out of memory while loading it"));
  }
}

// ----- Batching ----------------------------------------------------------------------------

std::vector<int64_t> BatchSampler::EpochPermutation(int64_t train_size, uint64_t seed,
                                                    int64_t epoch) {
  std::vector<int64_t> perm(static_cast<size_t>(std::max<int64_t>(train_size, 0)));
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
  std::mt19937_64 gen(Mix64(Mix64(seed) ^ Mix64(static_cast<uint64_t>(epoch) + 0x5eed)));
  for (size_t i = perm.size(); i > 1; --i) {
    const uint64_t j = BoundedDraw(gen, i);
    std::swap(perm[i - 1], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

BatchSampler::BatchSampler(const Dataset* dataset, int64_t batch_size, uint64_t seed,
                           DataCursor start)
    : dataset_(dataset),
      batch_size_(batch_size),
      seed_(seed),
      batches_per_epoch_(dataset->size(Split::kTrain) / batch_size),
      cursor_(start) {}

absl::StatusOr<BatchSampler> BatchSampler::Create(const Dataset* dataset, int64_t batch_size,
                                                  uint64_t seed, DataCursor start) {
  if (dataset == nullptr) return absl::InvalidArgumentError("BatchSampler: dataset is null");
  const int64_t train = dataset->size(Split::kTrain);
  if (batch_size <= 0 || batch_size > train) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch size ", batch_size, " must be in [1, ", train, "] (the training split of ",
        dataset->info().name, " has ", train, " samples)"));
  }
  const DatasetInfo& info = dataset->info();
  const std::optional<int64_t> batch_bytes = util::CheckedProduct(
      {batch_size, info.tokens_per_sample, info.input_features + info.target_features,
       static_cast<int64_t>(sizeof(float))});
  if (!batch_bytes.has_value() || *batch_bytes > kMaxBatchBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a batch of ", batch_size, " samples of ", info.name, " (", info.tokens_per_sample,
        " rows of ", info.input_features, " + ", info.target_features, " floats each) takes ",
        util::CheckedToString(batch_bytes), " bytes, more than the limit of ", kMaxBatchBytes,
        " bytes"));
  }
  const int64_t batches = train / batch_size;
  if (start.epoch < 0 || start.batch < 0 || start.batch >= batches) {
    return absl::InvalidArgumentError(
        absl::StrCat("data cursor (epoch ", start.epoch, ", batch ", start.batch,
                     ") is invalid: need epoch >= 0 and batch in [0, ", batches, ")"));
  }
  return BatchSampler(dataset, batch_size, seed, start);
}

Batch BatchSampler::Next() {
  if (permutation_epoch_ != cursor_.epoch) {
    permutation_ = EpochPermutation(dataset_->size(Split::kTrain), seed_, cursor_.epoch);
    permutation_epoch_ = cursor_.epoch;
  }
  const DatasetInfo& info = dataset_->info();
  const int64_t t = info.tokens_per_sample;
  Batch batch;
  batch.samples = batch_size_;
  batch.inputs.resize(batch_size_ * t, info.input_features);
  batch.targets.resize(batch_size_ * t, info.target_features);
  for (int64_t s = 0; s < batch_size_; ++s) {
    const int64_t index = permutation_[static_cast<size_t>(cursor_.batch * batch_size_ + s)];
    dataset_->GetSample(Split::kTrain, index, batch.inputs.data() + s * t * info.input_features,
                        batch.targets.data() + s * t * info.target_features);
  }
  if (++cursor_.batch == batches_per_epoch_) {
    cursor_.batch = 0;
    ++cursor_.epoch;
  }
  return batch;
}

Batch MakeEvalBatch(const Dataset& dataset, int64_t begin, int64_t count) {
  const int64_t available = dataset.size(Split::kEval);
  if (begin < 0 || begin >= available || count < 0) {
    count = 0;
  } else {
    count = std::min(count, available - begin);
  }
  const DatasetInfo& info = dataset.info();
  const int64_t t = info.tokens_per_sample;
  Batch batch;
  batch.samples = count;
  batch.inputs.resize(count * t, info.input_features);
  batch.targets.resize(count * t, info.target_features);
  for (int64_t s = 0; s < count; ++s) {
    dataset.GetSample(Split::kEval, begin + s, batch.inputs.data() + s * t * info.input_features,
                      batch.targets.data() + s * t * info.target_features);
  }
  return batch;
}

}  // namespace pipetrain::io
