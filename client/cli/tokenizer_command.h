// `pipetrain tokenizer train`: trains a SentencePiece tokenizer on a text file and writes a
// tokenizer directory; `pipetrain tokenizer encode`: prints a text's token ids (docs/tokenizer.md).
#ifndef PIPETRAIN_CLIENT_CLI_TOKENIZER_COMMAND_H_
#define PIPETRAIN_CLIENT_CLI_TOKENIZER_COMMAND_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "common/io/tokenizer.h"

namespace pipetrain::cli {

struct TokenizerCommandOptions {
  // The subcommand (the argument after `tokenizer`): "train" or "encode".
  std::string action;
  // --tokenizer DIR|FILE: encode's tokenizer. Required by encode.
  std::string tokenizer;
  // --input FILE: the training text, or the text to encode (any bytes; gzip-compressed is read
  // decompressed).
  // Required.
  std::string input;
  // --out DIR: the tokenizer directory to write (created if missing). Required by train.
  std::string out_dir;
  // --vocab-size, --model-type, --character-coverage (vocab_size required).
  io::TokenizerTrainOptions train;
  // --json: one JSON object describing the result instead of text.
  bool json = false;
};

// Runs `pipetrain tokenizer ACTION`. train: reads --input, trains, writes --out/tokenizer.model
// and --out/tokenizer.json, and prints what it wrote; the same input and flags write
// byte-identical files. encode: prints the token ids of --input's whole text with --tokenizer,
// separated by spaces on one line (--json: {"vocab_size": N, "ids": [...]}), exactly the ids a
// text data set reads. Errors: io::Tokenizer::Load's prefixed "--tokenizer"; INVALID_ARGUMENT for
// an unknown action, a missing flag, options out of range (io::CheckTokenizerTrainOptions), an
// empty input or a vocabulary the text cannot fill; the input file's errors (NOT_FOUND, ...)
// prefixed "--input"; FAILED_PRECONDITION or PERMISSION_DENIED prefixed "--out" when the directory
// cannot be written (checked before training).
absl::Status RunTokenizerCommand(const TokenizerCommandOptions& options, std::ostream& out);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_TOKENIZER_COMMAND_H_
