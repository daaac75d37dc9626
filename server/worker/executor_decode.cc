// StepExecutor's decoding (executor.h, "Decoding"): a Generate request's incremental forward over
// the chunks held here, one model::ChunkDecoder (KV caches) per chunk, between two steps.
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "common/wire/eval_key.h"
#include "server/worker/executor.h"

namespace pipetrain::worker {

absl::Status StepExecutor::StartDecode(int64_t request, int64_t sequences) {
  if (phase_ != Phase::kIdle) {
    return absl::FailedPreconditionError(
        absl::StrCat("generate request ", request, ": the last step ",
                     phase_ == Phase::kAwaitingCommit ? "awaits Commit or Abort"
                                                      : "failed and was not aborted"));
  }
  if (request <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("generate request id must be > 0, got ", request));
  }
  if (!model_->spec().layers(0).has_embedding()) {
    return absl::FailedPreconditionError(
        absl::StrCat("generate request ", request, ": model '", model_->spec().name(),
                     "' is not a language model (its first layer is not an embedding)"));
  }
  EndDecode();
  std::vector<std::unique_ptr<model::ChunkDecoder>> decoders;
  for (const OwnedChunk& c : chunks_) {
    PT_ASSIGN_OR_RETURN(std::unique_ptr<model::ChunkDecoder> d,
                        model::ChunkDecoder::Create(model_, c.stage.first_layer(),
                                                    c.stage.last_layer(), sequences));
    decoders.push_back(std::move(d));
  }
  decoders_ = std::move(decoders);
  decode_request_ = request;
  return absl::OkStatus();
}

absl::StatusOr<DecodeReport> StepExecutor::RunDecode(
    int64_t request, int64_t first_step, const std::vector<DecodeMicrobatch>& microbatches,
    int per_step) {
  if (decode_request_ == 0 || request != decode_request_) {
    return absl::FailedPreconditionError(
        absl::StrCat("decode round of generate request ", request, ": ",
                     decode_request_ == 0 ? std::string("no request is open")
                                          : absl::StrCat("request ", decode_request_, " is open")));
  }
  if (phase_ != Phase::kIdle) {
    return absl::FailedPreconditionError(
        absl::StrCat("decode round of generate request ", request, ": a step is in progress"));
  }
  if (microbatches.empty() || per_step < 1) {
    return absl::InvalidArgumentError(absl::StrCat("decode round ", first_step, ": ",
                                                   microbatches.size(), " micro-batches, ",
                                                   per_step, " per step"));
  }
  ApplyPendingUpdate();
  DecodeReport report;
  report.step = first_step;
  if (HoldsDownLast()) report.logits.resize(microbatches.size());
  for (size_t local = 0; local < chunks_.size(); ++local) {
    if (!routes_.IsDown(chunks_[local].chunk)) continue;  // decoding runs down only.
    for (size_t mb = 0; mb < microbatches.size(); ++mb) {
      const absl::Status s = DecodeOnly(first_step, static_cast<int>(mb), per_step,
                                        static_cast<int>(local), microbatches[mb], &report);
      if (!s.ok()) {
        return absl::Status(s.code(),
                            absl::StrCat("decode round ", first_step, " F(mb=", mb,
                                         ", chunk=", chunks_[local].chunk, "): ", s.message()));
      }
    }
  }
  return report;
}

absl::Status StepExecutor::DecodeOnly(int64_t first_step, int mb, int per_step, int local,
                                      const DecodeMicrobatch& run, DecodeReport* report) {
  const model::Stage& stage = chunks_[local].stage;
  const int chunk = chunks_[local].chunk;
  const bool first = routes_.IsFirst(chunk);
  const bool last = routes_.IsLast(chunk);
  if (run.rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat("a run of ", run.rows, " rows"));
  }
  const wire::TensorKey in_key =
      wire::EvalKey(first_step, mb, per_step, chunk,
                    first ? wire::TensorKind::kInput : wire::TensorKind::kActivation);
  PT_ASSIGN_OR_RETURN(
      math::Matrix x,
      TakeChecked(in_key, run.rows, model_->layer(stage.first_layer()).in_features()));
  if (first) {
    const int64_t vocab = model_->spec().layers(0).embedding().vocab_size();
    for (int64_t i = 0; i < x.rows(); ++i) {
      const float t = x(i, 0);
      if (!(t >= 0 && t < static_cast<float>(vocab)) || std::floor(t) != t) {
        return absl::InvalidArgumentError(absl::StrCat(in_key.ToString(), " row ", i, ": token ", t,
                                                       " is not an id in [0, ", vocab, ")"));
      }
    }
  }
  model::ChunkDecoder& decoder = *decoders_[local];
  if (run.restart) decoder.Clear(run.sequence);
  PT_ASSIGN_OR_RETURN(math::ConstMatrixMap y, decoder.Forward(stage.layer_params(), run.sequence,
                                                              run.position, math::AsConstMap(x)));
  if (!last) {
    sender_->Send(wire::EvalKey(first_step, mb, per_step, chunk + 1, wire::TensorKind::kActivation),
                  math::Matrix(y));
    return absl::OkStatus();
  }
  const float* row = y.data() + (y.rows() - 1) * y.cols();
  report->logits[mb].assign(row, row + y.cols());
  return absl::OkStatus();
}

void StepExecutor::EndDecode() {
  decoders_.clear();
  decode_request_ = 0;
}

int64_t StepExecutor::DecodeBytes() const {
  int64_t bytes = 0;
  for (const auto& d : decoders_) bytes += d->StateBytes();
  return bytes;
}

}  // namespace pipetrain::worker
