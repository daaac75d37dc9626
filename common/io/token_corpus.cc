#include "common/io/token_corpus.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/io/file_util.h"
#include "common/io/scoped_fd.h"
#include "common/io/table_dataset.h"
#include "common/util/status_macros.h"

namespace pipetrain::io {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token ids are read as they are");

// A single-file corpus holds out its last 1/kHoldOutDivisor tokens, as a text does.
constexpr int64_t kHoldOutDivisor = 10;
// Largest id when the model leaves the vocabulary to the data: ids travel as exact floats.
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

// A read-only, private mapping of a whole regular file. Not copyable.
class MappedFile {
 public:
  // Maps the file at `path`. An empty file maps nothing (data() is null, size() 0).
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path) {
    PT_RETURN_IF_ERROR(CheckNoNulByte(path));
    struct stat st;
    // stat before open: opening a FIFO would block.
    if (::stat(path.c_str(), &st) != 0) return ErrnoError(errno, "token corpus: cannot read", path);
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("token corpus: '", path, "' is not a regular file"));
    }
    ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) return ErrnoError(errno, "token corpus: cannot open", path);
    if (::fstat(fd.get(), &st) != 0) return ErrnoError(errno, "token corpus: cannot stat", path);
    auto file = std::unique_ptr<MappedFile>(new MappedFile());
    file->size_ = static_cast<int64_t>(st.st_size);
    if (file->size_ == 0) return file;
    void* p =
        ::mmap(nullptr, static_cast<size_t>(file->size_), PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (p == MAP_FAILED) return ErrnoError(errno, "token corpus: cannot map", path);
    file->data_ = static_cast<const unsigned char*>(p);
    return file;
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), static_cast<size_t>(size_));
  }
  const unsigned char* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  MappedFile() = default;
  const unsigned char* data_ = nullptr;
  int64_t size_ = 0;
};

// A run of token ids: a whole file, or a part of one.
struct Part {
  const MappedFile* file = nullptr;
  std::string path;
  int64_t first = 0;   // index of its first token in the file
  int64_t tokens = 0;  // ids in the part
};

class TokenCorpus : public Dataset {
 public:
  TokenCorpus(std::string name, int64_t id_bytes, int64_t context)
      : id_bytes_(id_bytes), context_(context) {
    info_.name = std::move(name);
    info_.input_features = 1;
    info_.target_features = 1;
    info_.tokens_per_sample = context;
    info_.token_ids = true;
  }

  const DatasetInfo& info() const override { return info_; }

  int64_t size(Split split) const override {
    return std::max<int64_t>(0, part(split).tokens - context_);
  }

  void GetSample(Split split, int64_t index, float* inputs, float* targets) const override {
    if (index < 0 || index >= size(split)) DieBadIndex(info_, split, index, size(split));
    const Part& p = part(split);
    for (int64_t t = 0; t < context_; ++t) {
      inputs[t] = static_cast<float>(Id(p, index + t));
      targets[t] = static_cast<float>(Id(p, index + t + 1));
    }
  }

  absl::Status CheckLabelsForModel(int64_t model_classes) const override {
    if (info_.num_classes <= model_classes) return absl::OkStatus();
    // The targets are the ids after the first of each part that has a window.
    for (Split split : {Split::kTrain, Split::kEval}) {
      if (size(split) == 0) continue;
      const Part& p = part(split);
      for (int64_t i = 1; i < p.tokens; ++i) {
        const int64_t id = Id(p, i);
        if (id < model_classes) continue;
        return absl::InvalidArgumentError(
            absl::StrCat(p.path, ": token id ", id, " at token ", p.first + i, " (byte ",
                         (p.first + i) * id_bytes_, ")",
                         OutOfRangeForModel(model_classes, "tokens", info_.num_classes)));
      }
    }
    return absl::OkStatus();
  }

  // Sets the parts (the mappings they point into are owned by this data set) and checks every
  // id against `vocab_size` (0: kMaxTokenId + 1, and num_classes becomes the largest id + 1).
  absl::Status SetParts(std::vector<std::unique_ptr<MappedFile>> files, Part train, Part eval,
                        int64_t vocab_size) {
    files_ = std::move(files);
    train_ = std::move(train);
    eval_ = std::move(eval);
    const int64_t bound = vocab_size > 0 ? vocab_size : kMaxTokenId + 1;
    int64_t largest = -1;
    for (const Part* p : {&train_, &eval_}) {
      for (int64_t i = 0; i < p->tokens; ++i) {
        const int64_t id = Id(*p, i);
        largest = std::max(largest, id);
        if (id < bound) continue;
        return absl::InvalidArgumentError(absl::StrCat(
            p->path, ": token id ", id, " at token ", p->first + i, " (byte ",
            (p->first + i) * id_bytes_, ") is not below ",
            vocab_size > 0 ? absl::StrCat("the model's vocabulary of ", vocab_size,
                                          " (its embedding's vocab_size)")
                           : absl::StrCat(bound, " (2^24: ids travel as exact floats)")));
      }
    }
    info_.num_classes = vocab_size > 0 ? vocab_size : largest + 1;
    return absl::OkStatus();
  }

 private:
  const Part& part(Split split) const { return split == Split::kTrain ? train_ : eval_; }

  int64_t Id(const Part& p, int64_t i) const {
    const unsigned char* at = p.file->data() + (p.first + i) * id_bytes_;
    if (id_bytes_ == 2) {
      uint16_t v;
      std::memcpy(&v, at, 2);
      return v;
    }
    uint32_t v;
    std::memcpy(&v, at, 4);
    return v;
  }

  DatasetInfo info_;
  int64_t id_bytes_;
  int64_t context_;
  std::vector<std::unique_ptr<MappedFile>> files_;
  Part train_;
  Part eval_;
};

// Maps `path` and checks its size is a whole number of ids.
absl::StatusOr<std::unique_ptr<MappedFile>> MapIds(const std::string& path, int64_t id_bytes) {
  PT_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> f, MappedFile::Open(path));
  if (f->size() % id_bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", f->size(), " bytes is not a whole number of uint", 8 * id_bytes,
                     " token ids (", id_bytes, " bytes each)",
                     id_bytes == 2 ? "; if the ids are uint32, say so: tokens:PATH:uint32" : ""));
  }
  return f;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> OpenTokenCorpus(absl::string_view arg,
                                                         const DatasetOptions& options) {
  absl::string_view path_text = arg;
  int64_t id_bytes = 2;
  if (absl::ConsumeSuffix(&path_text, ":uint32")) {
    id_bytes = 4;
  } else {
    absl::ConsumeSuffix(&path_text, ":uint16");
  }
  if (path_text.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset spec 'tokens:", arg, "': needs a path (tokens:PATH[:uint16|:uint32])"));
  }
  const std::string name = absl::StrCat("tokens:", arg);
  if (options.context <= 0 || options.context > kMaxTextContext) {
    return absl::InvalidArgumentError(absl::StrCat("dataset ", name, ": context ", options.context,
                                                   " is out of range [1, ", kMaxTextContext,
                                                   "] (the context of the model's embedding)"));
  }
  const std::string path(path_text);
  PT_RETURN_IF_ERROR(CheckNoNulByte(path));
  std::vector<std::unique_ptr<MappedFile>> files;
  Part train, eval;
  if (IsDirectory(path)) {
    train.path = JoinPath(path, "train.bin");
    eval.path = JoinPath(path, "val.bin");
    PT_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> train_file, MapIds(train.path, id_bytes));
    PT_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> eval_file, MapIds(eval.path, id_bytes));
    train.file = train_file.get();
    train.tokens = train_file->size() / id_bytes;
    eval.file = eval_file.get();
    eval.tokens = eval_file->size() / id_bytes;
    files.push_back(std::move(train_file));
    files.push_back(std::move(eval_file));
  } else {
    PT_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MapIds(path, id_bytes));
    const int64_t tokens = file->size() / id_bytes;
    train = Part{file.get(), path, 0, tokens - tokens / kHoldOutDivisor};
    eval = Part{file.get(), path, train.tokens, tokens / kHoldOutDivisor};
    files.push_back(std::move(file));
  }
  const int64_t windows = std::max<int64_t>(0, train.tokens - options.context) +
                          std::max<int64_t>(0, eval.tokens - options.context);
  if (windows > options.max_samples) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name, ": ", train.tokens + eval.tokens, " token ids give ", windows,
                     " windows (one per id): more than the limit of ", options.max_samples,
                     " samples (DatasetOptions::max_samples)"));
  }
  if (train.tokens <= options.context) {
    return absl::InvalidArgumentError(absl::StrCat(
        train.path, ": the training part has ", train.tokens, " token ids, too few for context ",
        options.context, ": it needs at least ", options.context + 1));
  }
  auto corpus = std::make_unique<TokenCorpus>(name, id_bytes, options.context);
  PT_RETURN_IF_ERROR(
      corpus->SetParts(std::move(files), std::move(train), std::move(eval), options.vocab_size));
  return std::unique_ptr<Dataset>(std::move(corpus));
}

}  // namespace pipetrain::io
