#include "client/cli/remote_generate.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/token_text.h"
#include "common/io/dataset.h"
#include "common/io/tokenizer.h"
#include "common/util/status_macros.h"

namespace pipetrain::cli {
namespace {

// The checks that need no coordinator.
absl::Status CheckRemoteGenerateOptions(const RemoteGenerateOptions& o) {
  if (o.coordinator.empty()) {
    return absl::InvalidArgumentError(
        "--coordinator HOST:PORT is required with --job (or the environment variable "
        "PIPETRAIN_COORDINATOR)");
  }
  if (o.job.empty()) return absl::InvalidArgumentError("--job ID is required with --coordinator");
  if (o.data.empty() && o.tokenizer.empty()) {
    return absl::InvalidArgumentError(
        "--data SET or --tokenizer DIR is required with --job: the text data set whose byte "
        "vocabulary the job's model uses, or the SentencePiece tokenizer the job was trained with");
  }
  if (!o.data.empty() && !o.tokenizer.empty()) {
    return absl::InvalidArgumentError(
        "give --data or --tokenizer with --job, not both: the tokenizer replaces the data set's "
        "byte vocabulary");
  }
  if (o.prompt.empty()) {
    return absl::InvalidArgumentError("--prompt TEXT is required: the text to continue");
  }
  if (o.max_tokens < 1 || o.max_tokens > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-tokens must be in [1, 4096] through the service, got ", o.max_tokens));
  }
  if (absl::Status s = model::CheckSamplingOptions(o.sampling); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", s.message()));
  }
  return absl::OkStatus();
}

// The codec of the job's text: the tokenizer `o.tokenizer` (whose piece count must be the job's
// vocabulary), else the byte vocabulary of text set `o.data`. FAILED_PRECONDITION if `spec` is no
// language model or neither fits it.
absl::StatusOr<TokenText> JobText(const RemoteGenerateOptions& o, const v1::ModelSpec& spec) {
  if (spec.layers_size() == 0 || !spec.layers(0).has_embedding()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", o.job, "' trains model '", spec.name(),
        "', not a language model (an embedding first): use `pipetrain predict` for a classifier"));
  }
  const int64_t vocab = spec.layers(0).embedding().vocab_size();
  io::DatasetInfo none;
  if (!o.tokenizer.empty()) {
    PT_ASSIGN_OR_RETURN(std::shared_ptr<const io::Tokenizer> tokenizer,
                        io::Tokenizer::Load(o.tokenizer));
    if (tokenizer->vocab_size() != vocab) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--tokenizer ", o.tokenizer, " has ", tokenizer->vocab_size(), " pieces but job '", o.job,
          "' has a vocabulary of ", vocab, ": give the tokenizer the job was trained with"));
    }
    return TokenText::For(std::move(tokenizer), none, vocab, "");
  }
  io::DatasetOptions options;
  if (!o.data_dir.empty()) options.data_dir = o.data_dir;
  options.context = spec.layers(0).embedding().context();
  PT_ASSIGN_OR_RETURN(std::unique_ptr<io::Dataset> data, io::OpenDataset(o.data, options));
  return TokenText::For(nullptr, data->info(), vocab,
                        "give --data the text the job trains on, or --tokenizer its tokenizer");
}

}  // namespace

absl::Status RunRemoteGenerateCommand(const RemoteGenerateOptions& o, std::ostream& out) {
  PT_RETURN_IF_ERROR(CheckRemoteGenerateOptions(o));
  PT_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> client,
                      client::Client::Connect(o.coordinator, o.client));
  PT_ASSIGN_OR_RETURN(v1::JobStatus status, client->GetJob(o.job));
  PT_ASSIGN_OR_RETURN(TokenText codec, JobText(o, status.spec().model()));
  absl::StatusOr<std::vector<int64_t>> prompt = codec.Encode(o.prompt);
  if (!prompt.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--prompt: ", prompt.status().message()));
  }
  client::GenerateOptions g;
  g.prompts.push_back(*std::move(prompt));
  g.max_tokens = o.max_tokens;
  g.temperature = o.sampling.temperature;
  g.top_k = o.sampling.top_k;
  g.seed = o.sampling.seed;
  PT_ASSIGN_OR_RETURN(v1::GenerateResult result, client->Generate(o.job, g));
  std::string text = o.prompt;
  for (const int64_t id : result.sequences(0).tokens()) text += codec.Next(id);
  out << text << "\n";
  return absl::OkStatus();
}

}  // namespace pipetrain::cli
