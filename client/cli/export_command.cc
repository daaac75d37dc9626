#include "client/cli/export_command.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/training_setup.h"
#include "common/io/dir_util.h"
#include "common/model/checkpoint.h"
#include "common/model/hf_checkpoint.h"
#include "common/model/model.h"
#include "common/util/status_macros.h"

namespace pipetrain::cli {
namespace {

absl::Status CheckFormat(const std::string& format, const char* command) {
  if (format.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--format hf is required: the layout to ",
                                                   command, " (hf: Hugging Face transformers)"));
  }
  if (format != "hf") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format '", format, "' is not one pipetrain ", command, "s (hf)"));
  }
  return absl::OkStatus();
}

// The vocabulary of the text data set `data` (the i-th byte is token i); "" for another kind.
absl::StatusOr<std::string> Vocabulary(const model::CheckpointManifest& m, const std::string& data,
                                       const std::string& data_dir) {
  if (data != "text" && !absl::StartsWith(data, "text:")) return std::string();
  absl::StatusOr<TrainingSetup> setup = SetUpTraining(m.model_spec, data, data_dir, m.seed);
  if (!setup.ok()) {
    return absl::Status(setup.status().code(),
                        absl::StrCat("the vocabulary (vocab.json) comes from the data set '", data,
                                     "': ", setup.status().message(),
                                     " (give --data text:PATH with the text it was trained on)"));
  }
  return setup->data->info().vocabulary;
}

// One line per file of the export directory `dir`.
void PrintFiles(const std::string& dir, std::ostream& out) {
  absl::StatusOr<std::vector<std::string>> files = io::ListDirectory(dir);
  if (!files.ok()) return;
  for (const std::string& f : *files) out << "  " << f << "\n";
}

}  // namespace

absl::Status RunExportCommand(const ExportCommandOptions& o, std::ostream& out) {
  PT_RETURN_IF_ERROR(CheckFormat(o.format, "export"));
  if (o.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "--resume DIR is required: the checkpoint directory to export (what --save wrote)");
  }
  if (o.out_dir.empty()) {
    return absl::InvalidArgumentError(
        "the directory to write is required: pipetrain export --format hf --resume CHECKPOINT "
        "DIR");
  }
  PT_ASSIGN_OR_RETURN(const model::LoadedCheckpoint ckpt, model::LoadCheckpoint(o.checkpoint_dir));
  const model::CheckpointManifest& m = ckpt.manifest;
  const std::string data = o.data.empty() ? m.data : o.data;
  PT_ASSIGN_OR_RETURN(const std::string vocabulary, Vocabulary(m, data, o.data_dir));
  PT_RETURN_IF_ERROR(model::ExportHfCheckpoint(ckpt, vocabulary, o.out_dir));
  PT_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> net, model::Model::Build(m.model_spec));
  PT_ASSIGN_OR_RETURN(const model::HfArchitecture* arch, model::HfArchitectureOf(*net));
  PT_ASSIGN_OR_RETURN(const std::string sizes, arch->describe(*net));
  out << absl::StrFormat("exported checkpoint %s (step %d, model %s) as %s (%s) into %s:\n",
                         o.checkpoint_dir, m.step, m.model_spec.name(), arch->model_type, sizes,
                         o.out_dir);
  PrintFiles(o.out_dir, out);
  if (vocabulary.empty()) {
    out << "no vocab.json: the checkpoint's data set ('" << data << "') is not a text\n";
  }
  return absl::OkStatus();
}

absl::Status RunImportCommand(const ImportCommandOptions& o, std::ostream& out) {
  PT_RETURN_IF_ERROR(CheckFormat(o.format, "import"));
  if (o.hf_dir.empty()) {
    return absl::InvalidArgumentError(
        "the directory to read is required: pipetrain import --format hf HF_DIR --save "
        "CHECKPOINT");
  }
  if (o.save_dir.empty()) {
    return absl::InvalidArgumentError("--save DIR is required: the checkpoint directory to write");
  }
  if (o.keep_checkpoints < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--keep-checkpoints must be >= 1, got ", o.keep_checkpoints));
  }
  PT_ASSIGN_OR_RETURN(const model::ImportedHfCheckpoint imported,
                      model::ImportHfCheckpoint(o.hf_dir));
  PT_RETURN_IF_ERROR(
      model::SaveCheckpoint(o.save_dir, imported.manifest, imported.tensors, o.keep_checkpoints));
  out << absl::StrFormat("imported %s (%s) into checkpoint %s: step %d, model %s\n", o.hf_dir,
                         imported.architecture->model_type, o.save_dir, imported.manifest.step,
                         imported.manifest.model_spec.name());
  if (imported.exact) {
    out << "with its pipetrain sidecar: the exported checkpoint's step, optimizer state, seed and "
           "data position\n";
  } else {
    out << "no pipetrain sidecar (" << model::kHfSidecarManifestFile
        << "): a fresh run from these weights (step 0, optimizer " << imported.manifest.optimizer
        << " with zero state, seed 0, no data set: give --data when training or evaluating)\n";
  }
  return absl::OkStatus();
}

}  // namespace pipetrain::cli
