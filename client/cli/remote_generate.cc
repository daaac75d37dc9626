#include "client/cli/remote_generate.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/io/byte_vocabulary.h"
#include "common/io/dataset.h"
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
  if (o.data.empty()) {
    return absl::InvalidArgumentError(
        "--data SET is required with --job: the text data set whose byte vocabulary the job's "
        "model uses");
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

// The byte vocabulary of text set `o.data` for the job's model `spec`.
absl::StatusOr<io::ByteVocabulary> VocabularyFor(const RemoteGenerateOptions& o,
                                                 const v1::ModelSpec& spec) {
  if (spec.layers_size() == 0 || !spec.layers(0).has_embedding()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", o.job, "' trains model '", spec.name(),
        "', not a language model (an embedding first): use `pipetrain predict` for a classifier"));
  }
  io::DatasetOptions options;
  if (!o.data_dir.empty()) options.data_dir = o.data_dir;
  options.context = spec.layers(0).embedding().context();
  PT_ASSIGN_OR_RETURN(std::unique_ptr<io::Dataset> data, io::OpenDataset(o.data, options));
  absl::StatusOr<io::ByteVocabulary> bytes = io::ByteVocabulary::Create(data->info().vocabulary);
  const int64_t vocab = spec.layers(0).embedding().vocab_size();
  if (!bytes.ok() || bytes->size() != vocab) {
    return absl::FailedPreconditionError(
        absl::StrCat("data set '", o.data, "' has no byte vocabulary of the job's ", vocab,
                     " tokens: give --data the text the job trains on"));
  }
  return bytes;
}

}  // namespace

absl::Status RunRemoteGenerateCommand(const RemoteGenerateOptions& o, std::ostream& out) {
  PT_RETURN_IF_ERROR(CheckRemoteGenerateOptions(o));
  PT_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> client,
                      client::Client::Connect(o.coordinator, o.client));
  PT_ASSIGN_OR_RETURN(v1::JobStatus status, client->GetJob(o.job));
  PT_ASSIGN_OR_RETURN(io::ByteVocabulary bytes, VocabularyFor(o, status.spec().model()));
  absl::StatusOr<std::vector<int64_t>> prompt = bytes.Encode(o.prompt);
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
  for (const int64_t id : result.sequences(0).tokens()) text += bytes.byte(id);
  out << text << "\n";
  return absl::OkStatus();
}

}  // namespace pipetrain::cli
