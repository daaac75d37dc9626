// Checkpoints: one safetensors file per layer that has parameters ("layer-00003.safetensors")
// plus a JSON manifest naming every file with its SHA-256 and size. Tensor names are global
// ("layers.3.weight", "optim.3.weight.exp_avg"). The layout does not depend on the partition: the
// same training state gives byte-identical layer files whether one process or any number of
// stages wrote it, and loads onto any number of stages. (The manifest format allows any
// contiguous layer range per file; pipetrain writes single layers.) docs/checkpoints.md describes
// the format.
//
// Saving is atomic as a set. A save writes every file into a fresh staging directory beside the
// destination and then publishes it (io::PublishDirectory): the destination directory is swapped
// for the staging one in a single rename, so after a crash at any point it holds the complete
// old checkpoint or the complete new one, never a mix. A distributed save splits this up:
//
//   coordinator: staging = BeginCheckpointStaging(dir)          // tell every writer `staging`
//   each writer: digests = WriteCheckpointShards(staging, its shards, tensors, step)
//   coordinator: manifest.shards = every writer's digests
//                (or DigestCheckpointShards(staging, shards) on a shared file system)
//                PublishCheckpoint(staging, dir, manifest)       // verifies, then publishes
//
// SaveCheckpoint does all of it in one process. A crash leaves at most a stale staging directory
// "DIR.tmp-PID-RANDOM" beside DIR, which loads ignore (CheckpointStore removes them).
//
// All functions are thread-safe (they share no state); two concurrent saves into the same
// directory both succeed and the last publish wins.
#ifndef PIPETRAIN_COMMON_MODEL_CHECKPOINT_H_
#define PIPETRAIN_COMMON_MODEL_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/io/dataset.h"
#include "common/io/safetensors.h"
#include "common/math/optimizer.h"
#include "common/math/tensor.h"
#include "common/model/model.h"
#include "pipetrain/v1/model.pb.h"

namespace pipetrain::model {

inline constexpr char kManifestName[] = "manifest.json";
// The manifest's "format". v2 added each shard's "sha256" and "bytes" and made them required;
// manifests of v1 are refused because they cannot be verified.
inline constexpr char kCheckpointFormat[] = "pipetrain.checkpoint.v2";
// The "format" entry of every layer file's safetensors metadata. The layer files did not change
// with manifest v2 and keep their bytes.
inline constexpr char kShardFormat[] = "pipetrain.checkpoint.v1";
// Steps, data cursors, batch sizes and byte counts in a manifest must be below 2^53: the step is
// converted to double (AdamW's bias correction, JSON readers that use doubles), which represents
// every integer only up to 2^53, so larger counters would silently stop counting.
inline constexpr int64_t kMaxManifestCount = int64_t{1} << 53;

struct CheckpointShard {
  std::string file;         // name inside the checkpoint directory, e.g. "layer-00003.safetensors".
  int64_t first_layer = 0;  // global layer range [first_layer, last_layer).
  int64_t last_layer = 0;
  // The file's SHA-256 (64 lowercase hex digits) and size in bytes: filled by
  // WriteCheckpointShards / DigestCheckpointShards, required by WriteCheckpointManifest. Empty /
  // 0 in the plan LayerShards returns.
  std::string sha256;
  int64_t bytes = 0;
};

// The tokenizer file of a checkpoint (docs/checkpoints.md, "Tokenizer"): the SentencePiece model
// of the job's text data, beside the layer files, so that evaluation and generation use the one
// the model was trained with (common/io/tokenizer.h).
inline constexpr char kCheckpointTokenizerFile[] = "tokenizer.model";

// A file of a checkpoint other than a layer file, with its SHA-256 and size.
struct CheckpointFile {
  std::string file;
  std::string sha256;  // 64 lowercase hex digits.
  int64_t bytes = 0;
};

struct CheckpointManifest {
  int64_t step = 0;          // optimizer steps applied.
  v1::ModelSpec model_spec;  // fully resolved spec.
  std::string optimizer;     // math::FormatOptimizerConfig text.
  uint64_t seed = 0;
  std::string data;        // data set spec, e.g. "digits"; "" if the writer did not know it.
  int64_t batch_size = 0;  // 0 if the writer did not know it.
  int64_t microbatches = 0;
  io::DataCursor data_cursor;  // position of the next batch.
  std::vector<CheckpointShard> shards;
  // The instruction-set level of the math that produced the last steps (math::IsaName, e.g.
  // "x86-64-v4"); "" if the writer did not record it (checkpoints older than the field, which
  // ran at x86-64-v3). A checkpoint loads at any level: weights are floats.
  std::string isa;
  // Empty while every step so far ran at `isa`. Otherwise (a run resumed from a checkpoint of
  // another level) which steps ran at which level: the bits then differ from a run that stayed on
  // one level (IsaNoteAfterResume).
  std::string isa_note;
  // The tokenizer the job's text was encoded with (file kCheckpointTokenizerFile), if any: the
  // manifest's optional "tokenizer" object.
  std::optional<CheckpointFile> tokenizer;
};

// Writes `model` (a tokenizer's serialized SentencePiece model) as kCheckpointTokenizerFile into
// the existing directory `dir` (a staging directory) atomically and returns the manifest entry.
// NOT_FOUND if `dir` does not exist; I/O errors naming the file.
absl::StatusOr<CheckpointFile> WriteCheckpointTokenizer(const std::string& dir,
                                                        absl::string_view model);

// The isa_note of the checkpoints of a run at level `isa` that resumed from `resumed`: empty if
// `resumed` has no note and ran at `isa`; otherwise `resumed`'s note followed by a sentence naming
// the steps up to resumed.step at resumed.isa and the later ones at `isa`.
std::string IsaNoteAfterResume(const CheckpointManifest& resumed, absl::string_view isa);

// Checks the bytes of `shard` (read from `path`, or received from another process under that
// name) against the manifest: size and SHA-256 (DATA_LOSS on a mismatch), the safetensors format,
// the file's "step" metadata equal to `step` and every value finite (DATA_LOSS naming the tensor).
// Returns the parsed file.
absl::StatusOr<io::SafetensorsFile> ParseCheckpointShard(const std::string& path,
                                                         const CheckpointShard& shard,
                                                         absl::string_view bytes, int64_t step);

// "layer-00003.safetensors" for layer 3.
std::string LayerShardFile(int64_t layer);

// The per-layer shards of layers [first, last) of `model` that have parameters to store, in
// layer order (without digests). A tied head without bias has none: its weight is the embedding's
// token table, stored in the embedding's file.
std::vector<CheckpointShard> LayerShards(const Model& model, int64_t first, int64_t last);

// Creates a fresh, empty staging directory beside `dir` ("DIR.tmp-PID-RANDOM", see
// io::CreateStagingDirectory) for a save into `dir` and returns its path; creates the parent of
// `dir` if missing. Nothing is written into `dir`. Errors: INVALID_ARGUMENT for a `dir` such as
// "" or "x/.."; FAILED_PRECONDITION if `dir` exists and is not a directory or not a checkpoint
// directory (see CheckCheckpointDestination); errno errors naming the path. The caller owns the
// staging directory: PublishCheckpoint consumes it, DiscardCheckpointStaging removes it.
absl::StatusOr<std::string> BeginCheckpointStaging(const std::string& dir);

// Writes the tensors of `shards` (each a single layer or range) taken from `tensors` (global
// names, e.g. Stage::ExportState) into the existing directory `dir` (normally a staging
// directory), one atomic file each, with `step` in the file metadata. Returns `shards` with
// sha256 and bytes filled from the bytes written. Errors: NOT_FOUND if `dir` does not exist (it
// is not created, so a writer cannot resurrect a discarded staging directory) or a tensor of a
// shard's layers is missing from `tensors`; INVALID_ARGUMENT for a shard file name that is not a
// plain name; I/O errors naming the file.
absl::StatusOr<std::vector<CheckpointShard>> WriteCheckpointShards(
    const std::string& dir, const std::vector<CheckpointShard>& shards,
    const std::map<std::string, math::Tensor>& tensors, int64_t step);

// The bytes of the layer file `*shard` names (the tensors of its layers taken from `tensors`,
// with `step` in the metadata), exactly as WriteCheckpointShards writes it; fills shard->sha256
// and shard->bytes. NOT_FOUND if `tensors` has none of its layers; INVALID_ARGUMENT for a file
// name that is not a plain name.
absl::StatusOr<std::string> SerializeCheckpointShard(
    CheckpointShard* shard, const std::map<std::string, math::Tensor>& tensors, int64_t step);

// Returns `shards` with sha256 and bytes computed from the files of that name in `dir`, for a
// manifest writer that shares a file system with the shard writers but did not receive their
// digests. NOT_FOUND naming a missing file; PERMISSION_DENIED for a symbolic link leading out of
// `dir`.
absl::StatusOr<std::vector<CheckpointShard>> DigestCheckpointShards(
    const std::string& dir, std::vector<CheckpointShard> shards);

// Writes `manifest` into the existing directory `dir` atomically (a single file: this is how a
// writer that knows more fields rewrites the manifest of a published checkpoint). Errors:
// INVALID_ARGUMENT naming the field when the manifest would not load (a shard without sha256, a
// step out of range, ...; see ReadCheckpointManifest); NOT_FOUND if `dir` does not exist.
absl::Status WriteCheckpointManifest(const std::string& dir, const CheckpointManifest& manifest);

// Writes `manifest` into `staging` (made by BeginCheckpointStaging(dir) and holding every shard
// file of the manifest), verifies the staged checkpoint as LoadCheckpoint would (so a checkpoint
// that would not load -- a missing, truncated or corrupt file, a step mismatch, NaN or Inf in a
// tensor -- never replaces an existing one), then publishes it as `dir` with
// io::PublishDirectory: `dir` switches from its old contents to the new checkpoint in one rename
// and the old contents are removed. Returns LoadCheckpoint's or WriteCheckpointManifest's error
// for a bad checkpoint, FAILED_PRECONDITION if `dir` exists but is not a checkpoint directory or
// its file system cannot exchange directories, I/O errors naming the path. On every error `dir`
// is unchanged (but for a failed fsync after the rename, see io::PublishDirectory) and `staging`
// has been removed.
//
// `keep` (>= 1) is how many checkpoints of this directory to keep: `dir` itself (the newest) and
// up to keep - 1 earlier ones beside it as "DIR.step-<step, 12 digits>" (CheckpointHistoryPath),
// each an ordinary checkpoint directory. The checkpoint `dir` held before moves there (unless it
// is of the same step); then the oldest are removed beyond keep - 1 (each atomically), so the
// newest complete checkpoint is never removed before the next one is complete. Removal failures
// do not fail the publish.
absl::Status PublishCheckpoint(const std::string& staging, const std::string& dir,
                               const CheckpointManifest& manifest, int keep = 1);

// Where PublishCheckpoint keeps the checkpoint of `step` that `dir` held before:
// "<dir without trailing slashes>.step-%012d".
std::string CheckpointHistoryPath(const std::string& dir, int64_t step);

// The earlier checkpoints kept beside `dir` (CheckpointHistoryPath), as (step, path), highest step
// first. Entries whose name does not have that form exactly are not listed. Errors:
// io::ListDirectory's for the parent of `dir`.
absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> CheckpointHistory(
    const std::string& dir);

// Removes a staging directory that will not be published (e.g. a shard writer failed). OK if it
// does not exist.
absl::Status DiscardCheckpointStaging(const std::string& staging);

// BeginCheckpointStaging(dir), WriteCheckpointShards for manifest.shards (their digest fields are
// ignored and filled in), WriteCheckpointTokenizer for a non-empty `tokenizer` (manifest.tokenizer
// is set from it, and cleared without one), then PublishCheckpoint. Errors as for those; on error
// `dir` is unchanged and nothing is left behind.
absl::Status SaveCheckpoint(const std::string& dir, const CheckpointManifest& manifest,
                            const std::map<std::string, math::Tensor>& tensors, int keep = 1,
                            absl::string_view tokenizer = {});

// Checks before training that a save into `dir` can succeed later: the parent of `dir` is
// created if missing and must be writable (the staging directory goes there, see
// io::CheckWritableDirectory for the errors), and an existing `dir` must be a directory that a
// save may replace: empty, or holding only what a checkpoint save writes (manifest.json, files
// named layer-NNNNN.safetensors or listed in its manifest, and temporaries of those).
// FAILED_PRECONDITION naming `dir` and an unexpected entry otherwise, so that `--save ~` cannot
// delete a home directory.
absl::Status CheckCheckpointDestination(const std::string& dir);

// Every file a checkpoint names (the manifest and each shard) is opened confined to its directory
// (io::OpenConfinedFile): a symbolic link is followed only to a file inside the directory, and one
// leading out is PERMISSION_DENIED naming the file and its target, by every function here that
// reads a checkpoint (ReadCheckpointManifest, LoadCheckpoint, VerifyCheckpoint,
// DigestCheckpointShards, PublishCheckpoint's verification).
//
// Reads the manifest of `dir`. NOT_FOUND without a manifest; DATA_LOSS for a file that is not a
// JSON object; INVALID_ARGUMENT naming the field for a malformed one: a missing or mistyped
// field, a format other than kCheckpointFormat (a v1 manifest "predates per-shard checksums"),
// step, batch_size, microbatches, data cursor or shard bytes negative or >= 2^53, a shard file
// name that is not plain or appears twice, a shard layer range empty or beyond the model's
// layers, a sha256 that is not 64 lowercase hex digits.
absl::StatusOr<CheckpointManifest> ReadCheckpointManifest(const std::string& dir);

// The text WriteCheckpointManifest writes into manifest.json for `manifest` (JSON, keys sorted,
// indented by two spaces, a final newline). No validation: see WriteCheckpointManifest.
std::string FormatCheckpointManifest(const CheckpointManifest& manifest);

// Parses and validates manifest text exactly as ReadCheckpointManifest does (same errors, each
// starting with `path`, the name the text is reported under).
absl::StatusOr<CheckpointManifest> ParseCheckpointManifest(absl::string_view text,
                                                           const std::string& path);

// OK if a run with `optimizer` may resume the checkpoint `manifest` (read from `dir`): the
// optimizer kinds must match, since the kind decides which state tensors the checkpoint holds per
// parameter (AdamW: exp_avg and exp_avg_sq; SGD: momentum_buffer or none) -- resuming AdamW state
// with SGD would drop the moments silently. The hyper-parameters (lr, weight decay, betas, eps,
// momentum, clip_norm) may change on resume; the learning-rate schedule is compared by the caller.
// Errors: FAILED_PRECONDITION naming `dir` and both kinds ("DIR: the checkpoint was trained with
// optimizer adamw, this run asks for sgd; ..."); INVALID_ARGUMENT naming `dir` if the manifest's
// optimizer text does not parse. Thread-safe.
absl::Status CheckOptimizerResumes(const std::string& dir, const CheckpointManifest& manifest,
                                   const math::OptimizerConfig& optimizer);

struct LoadedCheckpoint {
  CheckpointManifest manifest;
  std::map<std::string, math::Tensor> tensors;  // all shards merged.
  // The bytes of manifest.tokenizer's file (verified against its size and SHA-256); empty if the
  // manifest names none.
  std::string tokenizer;
};

// Reads the manifest and every shard, verifying each shard against the manifest before use.
// Errors (each naming the file, and the tensor where there is one): ReadCheckpointManifest's;
// DATA_LOSS when a file's size or SHA-256 differs from the manifest's (truncated or corrupted),
// when a file's "step" metadata is missing or differs from the manifest's step (both named), or
// when a tensor holds NaN or Inf; the safetensors reader's errors; INVALID_ARGUMENT for a tensor
// present in two shards. The tokenizer file, when the manifest names one, is checked likewise
// (DATA_LOSS for a size or SHA-256 that differs, NOT_FOUND when it is missing).
absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& dir);

// The tokenizer of the checkpoint in `dir`: the bytes of the file its manifest names, verified
// (size and SHA-256), or "" if the manifest names none. Errors: ReadCheckpointManifest's;
// DATA_LOSS or NOT_FOUND for the tokenizer file as LoadCheckpoint. Reads no layer file.
absl::StatusOr<std::string> ReadCheckpointTokenizer(const std::string& dir);

// LoadCheckpoint without keeping the tensors (one shard in memory at a time): OK exactly when
// LoadCheckpoint would succeed; returns the manifest.
absl::StatusOr<CheckpointManifest> VerifyCheckpoint(const std::string& dir);

}  // namespace pipetrain::model

#endif  // PIPETRAIN_COMMON_MODEL_CHECKPOINT_H_
