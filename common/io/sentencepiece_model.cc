// The module libpipetrain_sentencepiece.so (see sentencepiece_model.h). No Abseil header may be
// included here.
#include "common/io/sentencepiece_model.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

namespace pipetrain::io::spm {
namespace {

bool Fail(const sentencepiece::util::Status& status, Error* error) {
  if (status.ok()) return true;
  error->code = static_cast<int>(status.code());
  error->message = status.message();
  return false;
}

// Feeds the training sentences from memory.
class VectorIterator : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string_view>& sentences) : sentences_(sentences) {
    Load();
  }
  bool done() const override { return next_ > sentences_.size(); }
  void Next() override { Load(); }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }

 private:
  void Load() {
    if (next_ < sentences_.size()) value_.assign(sentences_[next_]);
    ++next_;
  }
  const std::vector<std::string_view>& sentences_;
  size_t next_ = 0;
  std::string value_;
};

class ModelImpl : public Model {
 public:
  int vocab_size() const override { return processor_.GetPieceSize(); }
  std::string IdToPiece(int id) const override { return processor_.IdToPiece(id); }
  bool Encode(std::string_view text, std::vector<int>* ids, Error* error) const override {
    return Fail(processor_.Encode(text, ids), error);
  }
  bool Decode(const std::vector<int>& ids, std::string* text, Error* error) const override {
    return Fail(processor_.Decode(ids, text), error);
  }
  sentencepiece::SentencePieceProcessor& processor() { return processor_; }

 private:
  sentencepiece::SentencePieceProcessor processor_;
};

class LibraryImpl : public Library {
 public:
  std::unique_ptr<Model> Load(const std::string& serialized, Error* error) const override {
    auto model = std::make_unique<ModelImpl>();
    if (!Fail(model->processor().LoadFromSerializedProto(serialized), error)) return nullptr;
    return model;
  }

  bool Train(const TrainSpec& spec, const std::vector<std::string_view>& sentences,
             std::string* model, Error* error) const override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::unordered_map<std::string, std::string> args = {
        {"model_type", spec.model_type},
        {"vocab_size", std::to_string(spec.vocab_size)},
        {"character_coverage", std::to_string(spec.character_coverage)},
        {"max_sentence_length", std::to_string(spec.max_sentence_length)},
        // The text exactly as written: no Unicode normalisation, spaces kept, so that decoding
        // the ids gives back the text; a newline is a piece of its own (the trainer sees lines).
        {"normalization_rule_name", "identity"},
        {"remove_extra_whitespaces", "false"},
        {"user_defined_symbols", "\n"},
        // Deterministic: every sentence (no sampling, no shuffling) and one thread.
        {"input_sentence_size", "0"},
        {"shuffle_input_sentence", "false"},
        {"num_threads", "1"},
        {"minloglevel", "2"},
    };
    VectorIterator iterator(sentences);
    return Fail(sentencepiece::SentencePieceTrainer::Train(args, &iterator, model), error);
  }

 private:
  mutable std::mutex mu_;  // serialises trainings.
};

}  // namespace
}  // namespace pipetrain::io::spm

extern "C" __attribute__((visibility("default"))) const pipetrain::io::spm::Library*
pipetrain_sentencepiece_library() {
  static const pipetrain::io::spm::Library* const library = new pipetrain::io::spm::LibraryImpl();
  return library;
}
