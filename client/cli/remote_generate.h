// `pipetrain generate --coordinator ADDR --job ID`: text continued by a running job's live
// weights through the service (the Generate RPC) instead of a checkpoint in this process.
#ifndef PIPETRAIN_CLIENT_CLI_REMOTE_GENERATE_H_
#define PIPETRAIN_CLIENT_CLI_REMOTE_GENERATE_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "client/sdk/client.h"
#include "common/model/token_sampler.h"

namespace pipetrain::cli {

struct RemoteGenerateOptions {
  std::string coordinator;          // --coordinator: HOST:PORT. Required.
  std::string job;                  // --job: the job's id. Required.
  std::string data;                 // --data: the text data set whose byte vocabulary the job's
                                    // model uses (what it trains on). Required.
  std::string tokenizer;            // --tokenizer: the job's tokenizer directory (or model file);
                                    // replaces --data's byte vocabulary.
  std::string data_dir;             // --data-dir: bundled data directory; empty: the built-in one.
  std::string prompt;               // --prompt: the text to continue, at least one byte.
  int64_t max_tokens = 200;         // --max-tokens: in [1, 4096] through the service.
  model::SamplingOptions sampling;  // --temperature, --top-k, --seed.
  client::ClientOptions client;     // security, keepalive and deadlines.
};

// Asks the job for its model (GetJob), maps the prompt to token ids with the byte vocabulary of
// the --data text set, generates through the service and writes the prompt followed by the
// generated text and a newline to `out`: exactly what `pipetrain generate --resume` writes for a
// checkpoint of the same weights with the same options. INVALID_ARGUMENT for a missing option
// or one out of range, or a prompt byte outside the vocabulary; FAILED_PRECONDITION for a job
// whose model is not a language model or whose vocabulary is not the data set's; the service's
// errors otherwise. Nothing is written before the tokens arrive.
absl::Status RunRemoteGenerateCommand(const RemoteGenerateOptions& options, std::ostream& out);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_REMOTE_GENERATE_H_
