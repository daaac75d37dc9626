#include "client/cli/tokenizer_command.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/io/dir_util.h"
#include "common/io/file_util.h"
#include "common/io/input_file.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace pipetrain::cli {
namespace {

// Largest training text (as for a data file).
constexpr int64_t kMaxInputBytes = int64_t{1} << 30;

// `status` with its message prefixed by `flag` and a space.
absl::Status Prefixed(const absl::Status& status, const std::string& flag) {
  return absl::Status(status.code(), absl::StrCat(flag, " ", status.message()));
}

absl::Status CheckOptions(const TokenizerCommandOptions& o) {
  if (o.action != "train" && o.action != "encode") {
    return absl::InvalidArgumentError(absl::StrCat(
        o.action.empty() ? "missing subcommand"
                         : absl::StrCat("unknown subcommand '", o.action, "'"),
        ": pipetrain tokenizer train --input FILE --vocab-size N --out DIR, or pipetrain "
        "tokenizer encode --input FILE --tokenizer DIR"));
  }
  if (o.input.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--input FILE is required: the text to ",
                                                   o.action == "train" ? "train on" : "encode"));
  }
  if (o.action == "encode") {
    if (o.tokenizer.empty()) {
      return absl::InvalidArgumentError(
          "--tokenizer DIR is required: the tokenizer to encode with");
    }
    return absl::OkStatus();
  }
  if (o.out_dir.empty()) {
    return absl::InvalidArgumentError(
        "--out DIR is required: the tokenizer directory to write (tokenizer.model)");
  }
  if (o.train.vocab_size == 0) {
    return absl::InvalidArgumentError(
        "--vocab-size N is required: the pieces of the tokenizer's vocabulary");
  }
  return io::CheckTokenizerTrainOptions(o.train);
}

// `tokenizer encode`: the ids of `text`.
absl::Status Encode(const TokenizerCommandOptions& o, const std::string& text, std::ostream& out) {
  absl::StatusOr<std::shared_ptr<const io::Tokenizer>> tokenizer = io::Tokenizer::Load(o.tokenizer);
  if (!tokenizer.ok()) return Prefixed(tokenizer.status(), "--tokenizer");
  PT_ASSIGN_OR_RETURN(std::vector<int32_t> ids, (*tokenizer)->Encode(text));
  if (o.json) {
    nlohmann::json j;
    j["vocab_size"] = (*tokenizer)->vocab_size();
    j["ids"] = ids;
    out << j.dump() << "\n";
  } else {
    out << absl::StrJoin(ids, " ") << "\n";
  }
  out.flush();
  return absl::OkStatus();
}

}  // namespace

absl::Status RunTokenizerCommand(const TokenizerCommandOptions& o, std::ostream& out) {
  PT_RETURN_IF_ERROR(CheckOptions(o));
  absl::StatusOr<std::string> text =
      io::ReadInputFile(o.action == "train" ? "training text" : "text", o.input, kMaxInputBytes,
                        io::InputCompression::kGzipDetected);
  if (!text.ok()) return Prefixed(text.status(), "--input");
  if (o.action == "encode") return Encode(o, *text, out);
  // Before the training, which may take minutes: an unwritable directory fails now.
  if (absl::Status s = io::CheckWritableDirectory(o.out_dir); !s.ok()) {
    return Prefixed(s, "--out");
  }
  PT_ASSIGN_OR_RETURN(std::string model, io::TrainTokenizer(*text, o.input, o.train));
  if (absl::Status s = io::WriteTokenizerDirectory(o.out_dir, model, o.train, *text); !s.ok()) {
    return Prefixed(s, "--out");
  }
  PT_ASSIGN_OR_RETURN(std::shared_ptr<const io::Tokenizer> tokenizer,
                      io::Tokenizer::Load(o.out_dir));
  PT_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->Encode(*text));
  const std::string model_path = io::JoinPath(o.out_dir, io::kTokenizerModelFile);
  if (o.json) {
    nlohmann::json j;
    j["tokenizer"] = model_path;
    j["vocab_size"] = tokenizer->vocab_size();
    j["model_type"] = o.train.model_type;
    j["sha256"] = tokenizer->sha256();
    j["input_bytes"] = text->size();
    j["input_tokens"] = ids.size();
    out << j.dump() << "\n";
  } else {
    out << absl::StrFormat(
        "tokenizer of %d pieces (%s) written to %s: %s, %d bytes, is %d tokens (%.2f bytes per "
        "token)\n",
        tokenizer->vocab_size(), o.train.model_type, model_path, o.input, text->size(), ids.size(),
        ids.empty() ? 0.0 : static_cast<double>(text->size()) / static_cast<double>(ids.size()));
  }
  out.flush();
  return absl::OkStatus();
}

}  // namespace pipetrain::cli
