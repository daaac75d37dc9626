// `pipetrain export` and `pipetrain import`: a checkpoint to the Hugging Face layout and back
// (common/model/hf_checkpoint.h; docs/checkpoints.md, "Export and import").
#ifndef PIPETRAIN_CLIENT_CLI_EXPORT_COMMAND_H_
#define PIPETRAIN_CLIENT_CLI_EXPORT_COMMAND_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace pipetrain::cli {

struct ExportCommandOptions {
  std::string format;          // --format: "hf" (the only one), required.
  std::string checkpoint_dir;  // --resume: the checkpoint to export, required.
  std::string out_dir;         // DIR: the directory to write, required.
  // --data: the text data set whose vocabulary becomes vocab.json; "" the checkpoint's.
  std::string data;
  std::string data_dir;  // --data-dir: bundled data directory; empty: the built-in one.
};

// Loads (and verifies) the checkpoint, writes its export into out_dir and prints one line per
// file to `out`. vocab.json is written when the data set is a text: the vocabulary is the data
// set's, opened as `evaluate` opens it (an error names what could not be read). Errors: a missing
// or unknown option (INVALID_ARGUMENT naming the flag), LoadCheckpoint's, ExportHfCheckpoint's
// (a model with no Hugging Face equivalent: INVALID_ARGUMENT naming the layer).
absl::Status RunExportCommand(const ExportCommandOptions& options, std::ostream& out);

struct ImportCommandOptions {
  std::string format;        // --format: "hf", required.
  std::string hf_dir;        // HF_DIR: the directory to read, required.
  std::string save_dir;      // --save: the checkpoint to write, required.
  int keep_checkpoints = 1;  // --keep-checkpoints, as for every --save.
};

// Reads the Hugging Face directory, saves it as a checkpoint into save_dir (SaveCheckpoint:
// atomic, verified) and prints what it wrote to `out`. Errors: ImportHfCheckpoint's,
// SaveCheckpoint's.
absl::Status RunImportCommand(const ImportCommandOptions& options, std::ostream& out);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_EXPORT_COMMAND_H_
