// SentencePiece (libsentencepiece-dev) behind a narrow interface, built as a module of its own
// (libpipetrain_sentencepiece.so) that common/io/tokenizer.cc loads with dlopen on first use.
//
// Why a module: Debian's libsentencepiece embeds its own copy of protobuf-lite 3.14 and exports
// its symbols; linked into a process that also loads libprotobuf 3.21 (every pipetrain binary),
// one copy's symbols bind the other's calls and protobuf aborts at start-up ("compiled against
// version 3.14.0 ... not compatible with the installed version (3.21.12)"). The module is opened
// with RTLD_LOCAL | RTLD_DEEPBIND, so that it and libsentencepiece resolve their own symbols
// first, and the rest of the process never sees them. Only virtual calls cross the boundary.
//
// Its headers also define `absl::string_view` as std::string_view, which collides with Debian's
// Abseil: this interface uses standard-library types only and includes no Abseil header.
#ifndef PIPETRAIN_COMMON_IO_SENTENCEPIECE_MODEL_H_
#define PIPETRAIN_COMMON_IO_SENTENCEPIECE_MODEL_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pipetrain::io::spm {

// An error of SentencePiece: its status code (numerically absl::StatusCode's) and message.
struct Error {
  int code = 0;  // 0: no error.
  std::string message;
};

// A loaded SentencePiece model. Immutable; every method is const and thread-safe
// (SentencePieceProcessor's are).
class Model {
 public:
  virtual ~Model() = default;
  // Pieces in the vocabulary (ids are [0, vocab_size())).
  virtual int vocab_size() const = 0;
  // The piece of `id` (0 <= id < vocab_size()).
  virtual std::string IdToPiece(int id) const = 0;
  // The ids of `text`. False with *error set on failure.
  virtual bool Encode(std::string_view text, std::vector<int>* ids, Error* error) const = 0;
  // The text of `ids` (each in [0, vocab_size())). False with *error set on failure.
  virtual bool Decode(const std::vector<int>& ids, std::string* text, Error* error) const = 0;
};

// What Library::Train passes to SentencePieceTrainer (the remaining settings are fixed there).
struct TrainSpec {
  std::string model_type;  // "bpe" or "unigram".
  int vocab_size = 0;
  double character_coverage = 1.0;
  int max_sentence_length = 0;
};

// The module's entry points. The one instance lives as long as the process.
class Library {
 public:
  virtual ~Library() = default;
  // Parses `serialized` (the bytes of a .model file: a serialized ModelProto). Null with *error
  // set when SentencePiece refuses it. Thread-safe.
  virtual std::unique_ptr<Model> Load(const std::string& serialized, Error* error) const = 0;
  // Trains a model on `sentences` (one string each, no newline) and returns its serialized bytes
  // in *model. False with *error set when SentencePiece fails (e.g. a vocabulary larger than the
  // text allows). Thread-safe (trainings are serialised: the trainer has process-wide settings).
  virtual bool Train(const TrainSpec& spec, const std::vector<std::string_view>& sentences,
                     std::string* model, Error* error) const = 0;
};

// The module's file name, and the path below an ancestor of the executable's directory where it
// is looked for (bin/../lib/pipetrain when installed, <build>/lib/pipetrain in a build tree).
inline constexpr char kModuleFile[] = "libpipetrain_sentencepiece.so";
inline constexpr char kModuleDir[] = "lib/pipetrain";
// Environment variable naming the module's path; it wins over the search.
inline constexpr char kModuleEnv[] = "PIPETRAIN_SENTENCEPIECE_MODULE";
// The exported function returning the module's Library (extern "C", no arguments).
inline constexpr char kEntryPoint[] = "pipetrain_sentencepiece_library";

}  // namespace pipetrain::io::spm

#endif  // PIPETRAIN_COMMON_IO_SENTENCEPIECE_MODEL_H_
