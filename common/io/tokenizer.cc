#include "common/io/tokenizer.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/io/data_dir.h"
#include "common/io/digest.h"
#include "common/io/dir_util.h"
#include "common/io/file_util.h"
#include "common/io/input_file.h"
#include "common/io/sentencepiece_model.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace pipetrain::io {
namespace {

using json = nlohmann::json;

// Largest tokenizer manifest.
constexpr int64_t kMaxManifestBytes = int64_t{1} << 16;

// SentencePiece's message without its source location ("./src/x.cc(12) [condition] message").
std::string Clean(const spm::Error& error) {
  const size_t end = error.message.rfind("] ");
  if (error.message.rfind("./src/", 0) == 0 && end != std::string::npos) {
    return error.message.substr(end + 2);
  }
  return error.message;
}

// Where the SentencePiece module is: $PIPETRAIN_SENTENCEPIECE_MODULE, else the first
// spm::kModuleDir/spm::kModuleFile below the executable's directory or one of its ancestors.
// Every path tried is appended to *tried.
std::string FindModule(std::vector<std::string>* tried) {
  if (const char* env = std::getenv(spm::kModuleEnv); env != nullptr && *env != '\0') {
    tried->push_back(absl::StrCat("$", spm::kModuleEnv, " = ", env));
    return env;
  }
  std::string dir = ExecutableDirectory();
  for (int depth = 0; depth < 8 && !dir.empty(); ++depth) {
    const std::string path = JoinPath(JoinPath(dir, spm::kModuleDir), spm::kModuleFile);
    tried->push_back(path);
    struct stat st;
    if (stat(path.c_str(), &st) == 0) return path;
    if (dir == "/") break;
    dir = DirName(dir);
  }
  return "";
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizerBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitizerBuild = true;
#else
constexpr bool kSanitizerBuild = false;
#endif
#else
constexpr bool kSanitizerBuild = false;
#endif

// The SentencePiece module, opened once per process (see sentencepiece_model.h for why it is
// not linked). FAILED_PRECONDITION naming the paths tried when it cannot be opened.
absl::StatusOr<const spm::Library*> SentencePiece() {
  static std::once_flag once;
  static const spm::Library* library = nullptr;
  static std::string* error = new std::string();
  std::call_once(once, [] {
    if (kSanitizerBuild) {
      *error =
          "tokenizers are not available in a sanitizer build: SentencePiece is opened with "
          "RTLD_DEEPBIND, which the sanitizers' runtime refuses (docs/tokenizer.md)";
      return;
    }
    std::vector<std::string> tried;
    const std::string path = FindModule(&tried);
    void* handle =
        path.empty() ? nullptr : dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (handle == nullptr) {
      *error =
          absl::StrCat("tokenizers need pipetrain's SentencePiece module ", spm::kModuleFile,
                       " (installed in lib/pipetrain; it needs the package libsentencepiece0): ",
                       path.empty() ? "not found" : dlerror(), " (looked for ",
                       absl::StrJoin(tried, ", "), "; set $", spm::kModuleEnv, " to its path)");
      return;
    }
    using Entry = const spm::Library* (*)();
    auto entry = reinterpret_cast<Entry>(dlsym(handle, spm::kEntryPoint));
    if (entry == nullptr) {
      *error = absl::StrCat(path, ": no ", spm::kEntryPoint, " (not pipetrain's module)");
      return;
    }
    library = entry();
  });
  if (library == nullptr) return absl::FailedPreconditionError(*error);
  return library;
}

}  // namespace

bool TokenizersAvailable() { return !kSanitizerBuild; }

namespace {

// The model's sha256 as the manifest of tokenizer directory `dir` records it, or "" without a
// manifest. INVALID_ARGUMENT for a manifest that is not a tokenizer manifest.
absl::StatusOr<std::string> ManifestSha256(const std::string& dir) {
  const std::string path = JoinPath(dir, kTokenizerManifestFile);
  absl::StatusOr<std::string> text =
      ReadInputFile("tokenizer manifest", path, kMaxManifestBytes, InputCompression::kNone);
  if (absl::IsNotFound(text.status())) return std::string();
  if (!text.ok()) return text.status();
  const json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("format") || j["format"] != kTokenizerFormat ||
      !j.contains("sha256") || !j["sha256"].is_string() ||
      !IsSha256Hex(j["sha256"].get<std::string>())) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a tokenizer manifest (a JSON object with \"format\": \"",
                     kTokenizerFormat, "\" and the model's \"sha256\")"));
  }
  return j["sha256"].get<std::string>();
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<spm::Model> model, std::string bytes, std::string sha256,
                     std::string origin)
    : spm_(std::move(model)),
      model_(std::move(bytes)),
      sha256_(std::move(sha256)),
      origin_(std::move(origin)) {}

Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::shared_ptr<const Tokenizer>> Tokenizer::FromModel(std::string model,
                                                                      const std::string& origin) {
  if (static_cast<int64_t>(model.size()) > kMaxTokenizerBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(origin, ": tokenizer model of ", model.size(),
                                                     " bytes is larger than the limit of ",
                                                     kMaxTokenizerBytes, " bytes"));
  }
  PT_ASSIGN_OR_RETURN(const spm::Library* library, SentencePiece());
  spm::Error error;
  std::unique_ptr<spm::Model> parsed = model.empty() ? nullptr : library->Load(model, &error);
  if (parsed == nullptr) {
    const std::string why = model.empty() ? "empty" : Clean(error);
    return absl::InvalidArgumentError(absl::StrCat(
        origin, ": not a SentencePiece model", why.empty() ? "" : absl::StrCat(" (", why, ")"),
        "; a tokenizer is a directory written by `pipetrain tokenizer train` or a .model file "
        "written by spm_train"));
  }
  if (parsed->vocab_size() < 1 || parsed->vocab_size() > kMaxTokenizerVocab) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": vocabulary of ", parsed->vocab_size(),
                                                   " pieces is outside [1, ", kMaxTokenizerVocab,
                                                   "]"));
  }
  PT_ASSIGN_OR_RETURN(FileDigest digest, DigestBytes(model));
  return std::shared_ptr<const Tokenizer>(
      new Tokenizer(std::move(parsed), std::move(model), std::move(digest.sha256), origin));
}

absl::StatusOr<std::shared_ptr<const Tokenizer>> Tokenizer::Load(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("tokenizer: empty path");
  std::string file = path;
  std::string expected_sha256;
  if (IsDirectory(path)) {
    file = JoinPath(path, kTokenizerModelFile);
    struct stat st;
    if (stat(file.c_str(), &st) != 0 && errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat(
          "tokenizer directory ", path, " holds no ", kTokenizerModelFile,
          " (a tokenizer directory is what `pipetrain tokenizer train --out DIR` writes)"));
    }
    PT_ASSIGN_OR_RETURN(expected_sha256, ManifestSha256(path));
  }
  PT_ASSIGN_OR_RETURN(std::string bytes, ReadInputFile("tokenizer", file, kMaxTokenizerBytes,
                                                       InputCompression::kNone));
  PT_ASSIGN_OR_RETURN(std::shared_ptr<const Tokenizer> tokenizer,
                      FromModel(std::move(bytes), file));
  if (!expected_sha256.empty() && tokenizer->sha256() != expected_sha256) {
    return absl::DataLossError(absl::StrCat(file, ": SHA-256 ", tokenizer->sha256(),
                                            " differs from the ", kTokenizerManifestFile, "'s ",
                                            expected_sha256, " (the file was changed or damaged)"));
  }
  return tokenizer;
}

int64_t Tokenizer::vocab_size() const { return spm_->vocab_size(); }

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text) const {
  std::vector<int> ids;
  spm::Error error;
  if (!spm_->Encode(std::string_view(text.data(), text.size()), &ids, &error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer ", origin_, ": cannot encode the text: ", Clean(error)));
  }
  return std::vector<int32_t>(ids.begin(), ids.end());
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", ids[i], " at position ", i,
                                                     " is outside the vocabulary [0, ",
                                                     vocab_size(), ") of tokenizer ", origin_));
    }
  }
  std::string text;
  spm::Error error;
  if (!spm_->Decode(std::vector<int>(ids.begin(), ids.end()), &text, &error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer ", origin_, ": cannot decode: ", Clean(error)));
  }
  return text;
}

std::string Tokenizer::Piece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  return spm_->IdToPiece(id);
}

absl::Status CheckTokenizerTrainOptions(const TokenizerTrainOptions& o) {
  if (o.vocab_size < kMinTrainVocab || o.vocab_size > kMaxTokenizerVocab) {
    return absl::InvalidArgumentError(absl::StrCat("--vocab-size must be in [", kMinTrainVocab,
                                                   ", ", kMaxTokenizerVocab, "], got ",
                                                   o.vocab_size));
  }
  if (o.model_type != "bpe" && o.model_type != "unigram") {
    return absl::InvalidArgumentError(
        absl::StrCat("--model-type must be bpe or unigram, got '", o.model_type, "'"));
  }
  if (!(o.character_coverage > 0 && o.character_coverage <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--character-coverage must be in (0, 1], got ",
                                                   absl::StrFormat("%g", o.character_coverage)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> TrainTokenizer(absl::string_view text, const std::string& input,
                                           const TokenizerTrainOptions& options) {
  PT_RETURN_IF_ERROR(CheckTokenizerTrainOptions(options));
  std::vector<std::string_view> lines;
  int64_t longest = 0;
  size_t start = 0;
  int64_t line_no = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == absl::string_view::npos) end = text.size();
    ++line_no;
    const int64_t length = static_cast<int64_t>(end - start);
    if (length > kMaxTrainLineBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          input, ":", line_no, ": line of ", length, " bytes is longer than the ",
          kMaxTrainLineBytes, " bytes a tokenizer trains on; break the text into lines"));
    }
    if (length > 0) lines.emplace_back(text.data() + start, end - start);
    longest = std::max(longest, length);
    start = end + 1;
  }
  if (lines.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        input, ": ", text.empty() ? "is empty" : "holds only newlines", ": nothing to train on"));
  }
  spm::TrainSpec spec;
  spec.model_type = options.model_type;
  spec.vocab_size = static_cast<int>(options.vocab_size);
  spec.character_coverage = options.character_coverage;
  spec.max_sentence_length = static_cast<int>(std::max<int64_t>(longest, 16));
  PT_ASSIGN_OR_RETURN(const spm::Library* library, SentencePiece());
  std::string model;
  spm::Error error;
  if (!library->Train(spec, lines, &model, &error)) {
    return absl::InvalidArgumentError(absl::StrCat(input, ": cannot train a ", options.model_type,
                                                   " tokenizer of --vocab-size ",
                                                   options.vocab_size, ": ", Clean(error)));
  }
  return model;
}

absl::Status WriteTokenizerDirectory(const std::string& dir, const std::string& model,
                                     const TokenizerTrainOptions& options,
                                     absl::string_view input_text) {
  PT_ASSIGN_OR_RETURN(std::shared_ptr<const Tokenizer> tokenizer,
                      Tokenizer::FromModel(model, "the trained model"));
  PT_ASSIGN_OR_RETURN(FileDigest input, DigestBytes(input_text));
  PT_RETURN_IF_ERROR(CheckWritableDirectory(dir));
  json j;
  j["format"] = kTokenizerFormat;
  j["model"] = kTokenizerModelFile;
  j["sha256"] = tokenizer->sha256();
  j["bytes"] = model.size();
  j["vocab_size"] = tokenizer->vocab_size();
  j["model_type"] = options.model_type;
  j["character_coverage"] = options.character_coverage;
  j["input_sha256"] = input.sha256;
  j["input_bytes"] = input.bytes;
  PT_RETURN_IF_ERROR(WriteFileAtomically(JoinPath(dir, kTokenizerModelFile), model));
  return WriteFileAtomically(JoinPath(dir, kTokenizerManifestFile), j.dump(2) + "\n");
}

}  // namespace pipetrain::io
