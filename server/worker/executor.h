// The stage worker's step executor: runs one worker's schedule actions (F, B, I, W on the model
// chunks it holds) for one training step, with inputs from a Mailbox and outputs to a Sender.
//
// The executor is the pipeline twin of model::ReferenceTrainer::Step: every chunk is a
// model::Stage, the last chunk's loss is computed with scale 1/batch_rows exactly as the reference
// does, weight gradients are added per chunk in the gradient tree's order of the step's
// micro-batches (model::GradTree; W run in increasing micro-batch order per chunk, checked), and
// the optimizer runs only on Commit with the clip scale the coordinator computed from every
// worker's per-layer squared gradient norms. Hence a pipeline of executors is bitwise equal to the
// reference for any placement and any valid schedule (tests/server/worker/executor_test.cc).
//
// Independent of gRPC: the transport plugs in as a Sender (outgoing) and by calling
// Mailbox::Put (incoming). See docs/executor.md.
#ifndef PIPETRAIN_SERVER_WORKER_EXECUTOR_H_
#define PIPETRAIN_SERVER_WORKER_EXECUTOR_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/math/tensor.h"
#include "common/model/chunk_decoder.h"
#include "common/model/model.h"
#include "common/model/stage.h"
#include "common/schedule/ir.h"
#include "common/wire/tensor_key.h"
#include "server/worker/chunk_routes.h"
#include "server/worker/gradient_exchange.h"
#include "server/worker/mailbox.h"
#include "server/worker/replica_reducer.h"

namespace pipetrain::worker {

// Outgoing half of the data plane. The executor calls Send from its compute thread for every
// activation (kActivation for chunk c+1 after F of chunk c) and input gradient (kGradient for
// chunk c-1 after I or B of chunk c > 0). Send takes ownership of `tensor` (the executor keeps
// no reference to it, so a transport can send it without a copy) and must not block on the
// network: it queues the tensor and returns. A transport that cannot deliver reports it out of band
// (e.g. by aborting the mailbox of the affected worker and telling the coordinator); the executor
// never learns of it from Send. Chunks held by this same worker are also sent through the Sender,
// which must then deliver them to this worker's own mailbox.
class Sender {
 public:
  virtual ~Sender() = default;
  virtual void Send(const wire::TensorKey& key, math::Matrix tensor) = 0;
};

struct ExecutorOptions {
  // Longest an action may wait for one input tensor before the step fails with
  // DEADLINE_EXCEEDED naming the action and the key. Infinite by default: a lost peer is
  // normally detected by its broken stream, which aborts the mailbox.
  absl::Duration input_timeout = absl::InfiniteDuration();
  // Data-parallel replicas (Assign.replicas): this worker holds its chunks in replica `replica`
  // of `replicas` (a power of two >= 1). A step's actions then cover the replica's M
  // micro-batches, the step's [replica M, (replica + 1) M) of M x replicas; RunStep's batch_rows
  // are the whole step's, and after the last W every chunk's gradients are summed over the
  // replicas (ReplicaReducer) before the tied exchange and the norms. Defaults: one replica.
  int replica = 0;
  int replicas = 1;
  // The job's chunks are two copies of num_chunks / 2 stages (bidirectional DualPipe,
  // chunk_routes.h): micro-batches [0, M/2) run through the down copy, [M/2, M) through the up
  // copy, each copy adds the weight gradients of its half, and from a chunk's last W on its
  // gradients are summed with the other copy's on the rank holding it (ReplicaReducer, a 2-peer
  // reduction of kCopyGradient messages with the down copy's part first), so that both apply the
  // same gradient: the whole step's, bit for bit the reference's. Evaluation and decoding run
  // through the down copy only. False: one copy. Not with replicas > 1.
  bool two_copies = false;
};

// One model chunk held by this worker: its global chunk index and the Stage over its layers.
struct OwnedChunk {
  int chunk = 0;
  model::Stage stage;
};

// Squared L2 norm of one global layer's gradients.
struct LayerNormSq {
  int64_t layer = 0;
  double norm_sq = 0;
};

// When one action ran, relative to the start of its RunStep (steady clock). The action waited on
// the mailbox during [start, ready) and computed (including handing outputs to the Sender) during
// [ready, end).
struct ActionTiming {
  schedule::Action action;
  absl::Duration start;
  absl::Duration ready;
  absl::Duration end;
  // When its output (activation, input gradient) was handed on: the end, except for a B, which
  // adds its weight gradients after it.
  absl::Duration output;
  absl::Duration wait() const { return ready - start; }
  absl::Duration compute() const { return end - ready; }
};

// What a worker reports to the coordinator after a successful RunStep.
struct StepReport {
  int64_t step = 0;
  // When RunStep began (steady clock): the origin of `timings`.
  std::chrono::steady_clock::time_point started;
  // Loss of each micro-batch, indexed by micro-batch (already scaled by 1/batch_rows), if this
  // worker holds the last chunk; empty otherwise. The coordinator sums them in increasing order
  // as float to get the step's loss.
  std::vector<float> microbatch_losses;
  // Squared gradient norms of every layer this worker holds, in increasing layer order, when
  // the optimizer clips gradients (model::Stage::clips_gradients); empty otherwise: only the
  // clip scale reads them, and summing 4 bytes per parameter is ~2% of a step.
  std::vector<LayerNormSq> layer_grad_norm_sq;
  // One entry per action, in execution order.
  std::vector<ActionTiming> timings;
  absl::Duration wait_time;     // sum of the actions' wait().
  absl::Duration compute_time;  // sum of the actions' compute().
  absl::Duration wall_time;     // RunStep entry to return.
  // The optimizer update applied since the previous RunStep (the last Commit's: at the Commit,
  // or deferred to the start of this RunStep), zero if none: this worker's compute between two
  // steps, which `timings` do not cover.
  absl::Duration update_time;
  int64_t peak_in_flight = 0;  // most (micro-batch, chunk) states held at once.
  // Most bytes those states, and the stages' deferred weight gradients, held at once.
  int64_t peak_stashed_bytes = 0;
  // With replicas (ExecutorOptions::replicas > 1) or two copies: the payload bytes this worker
  // sent in the reductions of the gradients over the replicas or the copies, and the time from
  // the first chunk's reduction start to the last one's end (overlapping the actions that ran
  // meanwhile).
  int64_t replica_bytes_sent = 0;
  absl::Duration replica_reduce_time;
};

// What a worker reports after a forward-only pass (StepExecutor::RunForward).
struct EvalReport {
  int64_t step = 0;
  // By micro-batch, if this worker holds the last chunk (empty otherwise): the loss summed over
  // the micro-batch's rows with scale 1 (double), and its rows whose argmax is the label
  // (math::Loss::CountCorrect), as model::ReferenceTrainer::Evaluate computes them per chunk.
  std::vector<double> loss_sums;
  std::vector<int64_t> correct;
};

// One micro-batch of a decode round (StepExecutor::RunDecode): a run of one sequence of a Generate
// request (model::DecodeRun), `rows` token positions from `position`, after forgetting every
// position of the sequence when `restart`.
struct DecodeMicrobatch {
  int64_t sequence = 0;
  int64_t position = 0;
  bool restart = false;
  int64_t rows = 0;
};

// What a worker reports after a decode round.
struct DecodeReport {
  int64_t step = 0;
  // By micro-batch, if this worker holds the last chunk (empty otherwise): the last layer's
  // output at the micro-batch's last row, i.e. the logits of the sequence's next token.
  std::vector<std::vector<float>> logits;
};

// The global squared gradient norm from every worker's report: the per-layer values placed by
// global layer and summed in increasing layer order (model::SumLayerNormSq), exactly as the
// reference trainer does. INVALID_ARGUMENT if a layer in [0, num_layers) is missing or reported
// twice, or a layer is out of range.
absl::StatusOr<double> CombineLayerNormSq(const std::vector<const StepReport*>& reports,
                                          int64_t num_layers);

// Not thread-safe (thread-compatible): one thread (the worker's compute thread) makes all calls.
// To interrupt a RunStep blocked on its inputs from another thread, abort the Mailbox; RunStep
// then returns the mailbox's status and the caller calls Abort().
//
// Life cycle per step: RunStep (ok) -> Commit, or RunStep (any outcome) -> Abort. A RunStep
// while a successful step awaits its Commit or Abort is FAILED_PRECONDITION, as is a RunStep
// after one that failed while running (not in its up-front checks) without Abort in between.
class StepExecutor {
 public:
  // `model`, `mailbox` and `sender` must outlive the executor. `chunks` are this worker's chunks
  // in any order, their Stages built over `model`; `num_chunks` is the number of chunks of the
  // whole model (S*V). INVALID_ARGUMENT if there is no chunk, the input timeout is not positive, a
  // chunk index is out of [0, num_chunks) or repeated, chunk 0 does not start at layer 0, the last
  // chunk does not end at the model's last layer, chunks are not in layer order, two consecutive
  // chunks held here leave a gap, or the replica count is not a power of two >= 1 or the replica
  // outside [0, replicas). With options.two_copies each copy is checked so (chunk S starts at
  // layer 0 too), and INVALID_ARGUMENT if num_chunks is odd, both copies of a stage are here, or
  // there is more than one replica.
  static absl::StatusOr<std::unique_ptr<StepExecutor>> Create(const model::Model* model,
                                                              std::vector<OwnedChunk> chunks,
                                                              int num_chunks, Mailbox* mailbox,
                                                              Sender* sender,
                                                              const ExecutorOptions& options = {});

  StepExecutor(const StepExecutor&) = delete;
  StepExecutor& operator=(const StepExecutor&) = delete;

  // Runs `actions` for step `step` strictly in order, after zeroing the gradients. `batch_rows`
  // is the row count of the whole batch (samples * rows per sample; with replicas the whole
  // step's, over every replica) and fixes the loss scale 1/batch_rows and the micro-batch shape
  // batch_rows / (M x replicas), where M is the number of micro-batches the actions cover. W of
  // the replica's micro-batch i adds the step's micro-batch replica M + i in the gradient tree of
  // the step's M x replicas micro-batches (model::GradTree).
  //
  // Before any compute the action list is checked on its own: every chunk held here, every
  // micro-batch in [0, M) with one F and either one B or one I and one W per chunk, F before
  // I before W, weight gradients per chunk in increasing micro-batch order (the bitwise contract).
  // A violation is INVALID_ARGUMENT naming the position and the action.
  // While running: F(mb, c) takes kInput (c = 0) or kActivation, and for the last chunk kTarget,
  // then sends kActivation for c+1 (c not last); I(mb, c) takes kGradient (c not last) and sends
  // kGradient for c-1 (c > 0); B = I then W. For a tied embedding (model::Model::tie) the step
  // ends with the tied gradient: a worker holding both chunk 0 and the last chunk sums their
  // parts itself; a worker holding one of them sends its part to the other's owner
  // (kTiedGradient for that chunk, micro-batch 0) and takes the peer's (SumWithPeer: the
  // embedding's part first), so that both copies get the same gradient and the reported norms
  // count it once (at the embedding's layer). With replicas, each chunk's gradients are first
  // summed over the replicas (ReplicaReducer, started as soon as the chunk's last W ran, awaited
  // before the step ends): the tied exchange then adds the replicas' sums of the two parts, as
  // the reference adds its two whole-batch parts, and the norms are those of the sums; a
  // reduction's error (a lost replica peer: the link's status) fails the step. With two copies
  // (ExecutorOptions::two_copies) the actions cover only the (micro-batch, chunk) pairs on each
  // micro-batch's route (ChunkRoutes), M must be even with M/2 a node of the gradient tree, a
  // loss chunk reports its half's losses (microbatch_losses has M entries, 0 for the other half),
  // the copies' gradients are summed (kCopyGradient, ReplicaReducer: started at each chunk's last
  // W, awaited before the step ends) before the tied gradient (whose two ends are
  // then on one rank), and the norms are reported once per stage, by the down copy's owner.
  // Received tensors are shape-checked
  // (INVALID_ARGUMENT); a mailbox error (aborted, deadline) is returned with its code. Every
  // error message names the action and its position.
  absl::StatusOr<StepReport> RunStep(int64_t step, const std::vector<schedule::Action>& actions,
                                     int64_t batch_rows);

  // A forward-only pass (evaluation run) whose keys start at mailbox step `first_step`, over
  // micro-batches of `microbatch_rows` rows each, micro-batch i keyed as wire::EvalKey(first_step,
  // i, `per_step`) (per_step: the job's M, the micro-batch indices its streams accept), on the
  // committed weights (a deferred update is applied first): for every chunk held here in
  // increasing chunk order, F of each micro-batch in order — a topological order of the forward
  // dependencies for every placement, so in-order execution cannot deadlock. Inputs arrive as for
  // RunStep's F (kInput / kActivation, kTarget for the last chunk) and activations leave the same
  // way; each F's state is dropped at once (no stash, no gradient). Errors: FAILED_PRECONDITION
  // while a step awaits Commit or Abort or failed; INVALID_ARGUMENT for no micro-batch, one that is
  // not whole samples, per_step < 1, or a received tensor's shape; a mailbox error with its code.
  // Messages name the micro-batch and chunk. The parameters, gradients and phase are unchanged
  // either way.
  absl::StatusOr<EvalReport> RunForward(int64_t first_step,
                                        const std::vector<int64_t>& microbatch_rows, int per_step);

  // ---- Decoding (executor_decode.cc): a Generate request's incremental forward, between steps.
  // Opens the decoding state of request `request` (> 0): one model::ChunkDecoder (the KV caches)
  // per chunk held here for `sequences` sequences, replacing any earlier request's.
  // FAILED_PRECONDITION while a step awaits Commit or Abort or failed; INVALID_ARGUMENT for
  // request <= 0 or as model::ChunkDecoder::Create (sequences out of range, a layer without an
  // incremental forward).
  absl::Status StartDecode(int64_t request, int64_t sequences);
  // One decode round of request `request` whose keys start at mailbox step `first_step`:
  // micro-batch i keyed as wire::EvalKey(first_step, i, `per_step`), its runs through every chunk
  // held here in increasing chunk order, each micro-batch in order (as RunForward: no deadlock for
  // any placement), on the committed weights (a deferred update is applied first). Chunk 0 takes
  // kInput [rows, 1] (token ids, each an integer in [0, vocab)), the others kActivation, and every
  // chunk but the last sends kActivation on; the last reports each micro-batch's last row.
  // Errors: FAILED_PRECONDITION for another request than the open one (or none) or while a step
  // awaits Commit or Abort; INVALID_ARGUMENT for no micro-batch, per_step < 1, a bad token id or
  // shape, or a run that does not continue its sequence's positions (model::ChunkDecoder);
  // a mailbox error with its code. Messages name the micro-batch and chunk. A failed round leaves
  // the sequences' states undefined: the caller ends the request (EndDecode).
  absl::StatusOr<DecodeReport> RunDecode(int64_t request, int64_t first_step,
                                         const std::vector<DecodeMicrobatch>& microbatches,
                                         int per_step);
  // Frees the open request's decoding state (its KV caches); no-op without one. Abort does too.
  void EndDecode();
  // The open request (0: none) and the bytes its KV caches hold now.
  int64_t decode_request() const { return decode_request_; }
  int64_t DecodeBytes() const;

  // Applies optimizer update number `optimizer_step` (1-based count of applied steps, as
  // ReferenceTrainer::steps_done after the step) on every chunk, with the gradients scaled by
  // `clip_scale` (math::ClipScale of the global norm). FAILED_PRECONDITION unless the last
  // RunStep succeeded and was neither committed nor aborted; INVALID_ARGUMENT if
  // optimizer_step < 1 or clip_scale is not finite and > 0. Fails exactly when CheckCommit
  // does, and then changes nothing. With `defer` the update is recorded and applied before
  // whatever next reads or changes the parameters or gradients (RunStep, Abort, ExportState,
  // GradNormSqPerLayer): a worker whose next step starts by waiting for a peer spends that wait
  // on it instead of the time between steps. Either way the results are bit for bit the same.
  absl::Status Commit(int64_t optimizer_step, float clip_scale, bool defer = false);
  // The checks of Commit alone: OK means Commit with the same arguments will succeed, so that a
  // caller may confirm the commit before spending the time to apply it.
  absl::Status CheckCommit(int64_t optimizer_step, float clip_scale) const;

  // Discards the current step: zeroes the gradients and frees every micro-batch state. The
  // parameters and optimizer state are untouched. Always succeeds; idempotent.
  void Abort();

  // Per-layer squared gradient norms now (increasing layer order), e.g. to check Abort.
  std::vector<LayerNormSq> GradNormSqPerLayer();
  // Parameters and optimizer state of every chunk held here, by global tensor name
  // (model::Stage::ExportState merged), with every committed update applied.
  std::map<std::string, math::Tensor> ExportState();

  // Global chunk indices held here, increasing.
  std::vector<int> chunk_indices() const;

 private:
  // Per (micro-batch, local chunk) state from F until W.
  struct InFlight {
    model::MicrobatchState state;
    int64_t out_rows = 0;  // shape of the chunk's output (sent on, so not kept in `state`).
    int64_t out_cols = 0;
    math::Matrix dpred;  // last chunk only: dL/d(prediction) from F until I.
    bool input_grad_done = false;
  };
  enum class Phase { kIdle, kAwaitingCommit, kFailed };
  using Clock = std::chrono::steady_clock;

  StepExecutor(const model::Model* model, std::vector<OwnedChunk> chunks, const ChunkRoutes& routes,
               Mailbox* mailbox, Sender* sender, const ExecutorOptions& options);

  // Sets every stage's gradient tree (the step's m x replicas micro-batches, this replica's share
  // of m) and zeroes the gradients; starts the step's reduction over the replicas.
  absl::Status StartGradients(int64_t step, int m);
  // After the actions ran with `status`: the sums over the replicas or the copies (or, on error,
  // the reductions cancelled and drained), then the tied exchange and the norms.
  // Returns the step's status.
  absl::Status FinishGradients(int64_t step, absl::Status status, StepReport* report);
  // Runs the `actions` CheckActionList (action_list.h) accepted; timings are relative to `t0`.
  absl::Status RunStepImpl(int64_t step, const std::vector<schedule::Action>& actions,
                           int64_t batch_rows, int64_t microbatches, Clock::time_point t0,
                           StepReport* report);
  absl::Status Forward(int64_t step, const schedule::Action& a, int local, int64_t mb_rows,
                       double loss_scale, StepReport* report, Clock::time_point* ready);
  // RunForward's F of micro-batch `mb` (`rows` rows) on local chunk `local`.
  absl::Status ForwardOnly(int64_t first_step, int mb, int per_step, int local, int64_t rows,
                           EvalReport* report);
  // RunDecode's run of micro-batch `mb` on local chunk `local`.
  absl::Status DecodeOnly(int64_t first_step, int mb, int per_step, int local,
                          const DecodeMicrobatch& run, DecodeReport* report);
  absl::Status InputGrad(int64_t step, const schedule::Action& a, int local,
                         Clock::time_point* ready);
  absl::Status WeightGrad(const schedule::Action& a, int local);
  // With replicas or two copies, after the step's last action: waits for the chunks' sums
  // (ReplicaReducer), puts them into the stages and, with replicas, takes the chunks' norms.
  absl::Status ApplyReducedSums(int64_t step, StepReport* report);
  // After the step's last W: gives every tied-table copy held here the tied gradient (see
  // RunStep) and updates the copies' layers in chunk_norms_.
  absl::Status ExchangeTiedGradients(int64_t step, ExchangeTransport* transport);
  // The gradient norms after the step's exchanges: of each chunk's last W, or with two copies
  // those of the down copy's chunks after the copies' sum, into report->layer_grad_norm_sq.
  absl::Status ReportNorms(int64_t step, StepReport* report);
  // Whether this worker holds the chunk that computes the loss of the down copy (or of the one
  // copy): the chunk whose losses evaluation and decoding report.
  bool HoldsDownLast() const { return local_of_chunk_[routes_.copy_chunks() - 1] >= 0; }
  // Takes `key` from the mailbox and checks its shape ([rows, cols]; rows < 0: any).
  absl::StatusOr<math::Matrix> TakeChecked(const wire::TensorKey& key, int64_t rows, int64_t cols);
  // Bytes held by the in-flight states (inputs, stashes, gradients, dpred) and by what the stages
  // keep for deferred weight gradients (model::Stage::DeferredWeightGradBytes).
  int64_t InFlightBytes() const;
  InFlight* FindInFlight(int mb, int local);
  // A fresh or pooled state registered for (mb, local).
  InFlight* AcquireInFlight(int mb, int local);
  // Returns the state of (mb, local) to the pool.
  void ReleaseInFlight(int mb, int local);
  // Frees every in-flight state's memory and returns it to the pool.
  void DiscardInFlight();
  // Applies the update a deferred Commit recorded, if any.
  void ApplyPendingUpdate();

  // Constant after construction.
  const model::Model* const model_;
  const int num_chunks_;
  Mailbox* const mailbox_;
  Sender* const sender_;
  const ExecutorOptions options_;
  std::vector<int> local_of_chunk_;  // [global chunk] -> local index, or -1.
  // The reductions over the replicas or the copies (null with one replica and one copy); its
  // thread calls sender_.
  std::unique_ptr<ReplicaReducer> reducer_;
  ChunkRoutes routes_;  // one or two copies of the stages.

  std::vector<OwnedChunk> chunks_;  // increasing chunk index.
  Phase phase_ = Phase::kIdle;
  // A committed update not applied yet (Commit with defer): optimizer step and clip scale.
  std::optional<std::pair<int64_t, float>> pending_update_;
  // Time spent applying updates since the last RunStep took it into its report.
  absl::Duration unreported_update_time_;
  // This step: micro-batches, W (or B) actions done per local chunk, and each local chunk's
  // per-layer gradient norms, taken by its last W.
  int step_microbatches_ = 0;
  int64_t grad_share_lo_ = 0;  // the step's number of this replica's micro-batch 0.
  std::vector<int> weight_grads_done_;
  std::vector<int> weight_grads_due_;  // per local chunk: the micro-batches of its share.
  std::vector<std::vector<double>> chunk_norms_;
  // Whether steps take the gradient norms (the chunks' optimizer clips); constant.
  bool take_norms_ = false;
  // In-flight states by (mb, local chunk), and a pool of reusable ones (their matrices already
  // freed by Stage::BackwardWeight) so steady-state steps do not allocate the bookkeeping.
  absl::flat_hash_map<std::pair<int, int>, std::unique_ptr<InFlight>> in_flight_;
  std::vector<std::unique_ptr<InFlight>> pool_;
  // The open Generate request (0: none) and its decoders, [local chunk].
  int64_t decode_request_ = 0;
  std::vector<std::unique_ptr<model::ChunkDecoder>> decoders_;
};

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_EXECUTOR_H_
