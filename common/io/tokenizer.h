// A SentencePiece tokenizer (libsentencepiece): text to token ids and back, loaded from a model
// file or a tokenizer directory, trained from a text (`pipetrain tokenizer train`), and carried in
// checkpoints and JobSpecs as the model file's bytes. docs/tokenizer.md describes the directory,
// the training settings and how text data sets use it.
//
// A tokenizer directory holds kTokenizerModelFile (the SentencePiece model, as spm_train writes
// it) and, when pipetrain wrote it, kTokenizerManifestFile: a small JSON file with the model's
// SHA-256, vocabulary size and training settings.
#ifndef PIPETRAIN_COMMON_IO_TOKENIZER_H_
#define PIPETRAIN_COMMON_IO_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pipetrain::io {

namespace spm {
class Model;
}  // namespace spm

inline constexpr char kTokenizerModelFile[] = "tokenizer.model";
inline constexpr char kTokenizerManifestFile[] = "tokenizer.json";
inline constexpr char kTokenizerFormat[] = "pipetrain.tokenizer.v1";
// Largest model file accepted (a 32k-piece model is about 0.5 MB, 256k pieces about 5 MB). It
// travels in a JobSpec, which the coordinator journals in records of at most 16 MiB.
inline constexpr int64_t kMaxTokenizerBytes = int64_t{8} << 20;
// Largest vocabulary: token ids travel as floats, exact below 2^24.
inline constexpr int64_t kMaxTokenizerVocab = int64_t{1} << 24;

// False in a sanitizer build (ASan, TSan; scripts/sanitize.sh): their runtimes refuse the
// RTLD_DEEPBIND that loading SentencePiece needs (common/io/sentencepiece_model.h), so every
// function here that parses or trains a model is then FAILED_PRECONDITION. True otherwise.
bool TokenizersAvailable();

// A loaded SentencePiece model. Immutable; every method is const and thread-safe.
class Tokenizer {
 public:
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Loads the tokenizer at `path`: a tokenizer directory (its kTokenizerModelFile, checked
  // against its kTokenizerManifestFile's sha256 when there is one) or a SentencePiece model file.
  // Errors name the path: FAILED_PRECONDITION if SentencePiece cannot be loaded (every function
  // here that parses or trains a model: see common/io/sentencepiece_model.h); NOT_FOUND if it does
  // not exist or a directory holds no kTokenizerModelFile; INVALID_ARGUMENT for something that is
  // not a SentencePiece model (or not a regular file), a manifest that is not a tokenizer manifest,
  // a vocabulary above kMaxTokenizerVocab; DATA_LOSS if the model's SHA-256 differs from the
  // manifest's; RESOURCE_EXHAUSTED for a file larger than kMaxTokenizerBytes.
  static absl::StatusOr<std::shared_ptr<const Tokenizer>> Load(const std::string& path);

  // Parses `model` (the bytes of a SentencePiece model file); `origin` names where they came from
  // in error messages (a path, "the checkpoint's tokenizer", "JobSpec.tokenizer"). Errors as for
  // Load (INVALID_ARGUMENT, RESOURCE_EXHAUSTED), each starting with `origin`.
  static absl::StatusOr<std::shared_ptr<const Tokenizer>> FromModel(std::string model,
                                                                    const std::string& origin);

  // Pieces in the vocabulary: ids are [0, vocab_size()).
  int64_t vocab_size() const;
  // The serialized SentencePiece model (what kTokenizerModelFile holds) and its SHA-256.
  const std::string& model() const { return model_; }
  const std::string& sha256() const { return sha256_; }
  // Where it was loaded from (a path, or FromModel's origin).
  const std::string& origin() const { return origin_; }

  // The token ids of `text`, each in [0, vocab_size()). INVALID_ARGUMENT naming origin() if
  // SentencePiece fails (e.g. text larger than 2 GiB).
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const;

  // The text of `ids`. INVALID_ARGUMENT naming the first id outside [0, vocab_size()) and its
  // position.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const;

  // The piece of `id` (e.g. "▁the"); "" for an id outside [0, vocab_size()).
  std::string Piece(int32_t id) const;

 private:
  Tokenizer(std::unique_ptr<spm::Model> model, std::string bytes, std::string sha256,
            std::string origin);

  const std::unique_ptr<spm::Model> spm_;
  const std::string model_;
  const std::string sha256_;
  const std::string origin_;
};

// How TrainTokenizer trains (the flags of `pipetrain tokenizer train`).
struct TokenizerTrainOptions {
  // --vocab-size N: pieces in the vocabulary, in [kMinTrainVocab, kMaxTokenizerVocab]; at most
  // what the text allows (SentencePiece says how many).
  int64_t vocab_size = 0;
  // --model-type: "bpe" (default) or "unigram".
  std::string model_type = "bpe";
  // --character-coverage: the fraction of the text's characters the vocabulary must cover, in
  // (0, 1]; the rarest others become the unknown piece. 1 (default) keeps every character.
  double character_coverage = 1.0;
};

// Smallest vocabulary TrainTokenizer accepts: the unknown, begin and end pieces, the newline and
// at least one piece of text.
inline constexpr int64_t kMinTrainVocab = 5;
// Longest line TrainTokenizer trains on (SentencePiece's trainer would skip longer ones).
inline constexpr int64_t kMaxTrainLineBytes = int64_t{1} << 20;

// INVALID_ARGUMENT naming the flag (--vocab-size, --model-type, --character-coverage) if `options`
// are out of range. Pure.
absl::Status CheckTokenizerTrainOptions(const TokenizerTrainOptions& options);

// Trains a SentencePiece model on `text` (read from `input`, which messages name) as `options`
// say, and returns its serialized bytes. The same text and options give the same bytes (one
// thread, every line used, no sampling). Settings not in `options` are fixed: the text is taken
// exactly as written (no normalisation, spaces kept: decoding gives the text back) and a newline
// is a piece of its own. Errors: CheckTokenizerTrainOptions's; INVALID_ARGUMENT naming `input`
// for an empty text (or one of only newlines), a line longer than kMaxTrainLineBytes, or a
// vocabulary the text cannot fill (SentencePiece's message says the largest it can). Thread-safe
// (trainings are serialised).
absl::StatusOr<std::string> TrainTokenizer(absl::string_view text, const std::string& input,
                                           const TokenizerTrainOptions& options);

// Writes a tokenizer directory `dir` (created if missing): kTokenizerModelFile holding `model`
// and kTokenizerManifestFile with its SHA-256, vocabulary size, `options` and the SHA-256 and
// size of the training text `input_text`, each file atomically. The files' bytes depend only on
// those arguments. Errors: INVALID_ARGUMENT if `model` is not a SentencePiece model;
// FAILED_PRECONDITION or PERMISSION_DENIED naming `dir` when it cannot be created or written
// (io::CheckWritableDirectory). Thread-compatible.
absl::Status WriteTokenizerDirectory(const std::string& dir, const std::string& model,
                                     const TokenizerTrainOptions& options,
                                     absl::string_view input_text);

}  // namespace pipetrain::io

#endif  // PIPETRAIN_COMMON_IO_TOKENIZER_H_
