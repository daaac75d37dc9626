// The stage worker's executor, run as an in-process pipeline: S workers, each with its own
// Mailbox and StepExecutor on its own thread, an in-memory Sender routing tensors by the plan's
// placement, and a tiny coordinator feeding micro-batches, combining losses and gradient norms,
// and committing. For every schedule kind the result must equal the reference trainer bitwise.
#include "server/worker/executor.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "common/io/dataset.h"
#include "common/math/det_math.h"
#include "common/math/optimizer.h"
#include "common/model/decode_window.h"
#include "common/model/generator.h"
#include "common/model/model.h"
#include "common/model/reference_trainer.h"
#include "common/model/stage.h"
#include "common/model/token_sampler.h"
#include "common/partition/partitioner.h"
#include "common/schedule/generator.h"
#include "common/schedule/ir.h"
#include "common/schedule/validator.h"
#include "common/util/status_macros.h"
#include "common/wire/eval_key.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker/mailbox.h"
#include "tests/common/model/test_models.h"

namespace pipetrain::worker {
namespace {

using schedule::Action;
using schedule::Op;
using schedule::ScheduleKind;
using ::testing::HasSubstr;
using wire::TensorKey;
using wire::TensorKind;

// A digits-style classifier (64 features, 10 classes), deep enough for S*V = 8 chunks and more:
// 8 linear + activation pairs, a layer norm and the output layer (18 layers).
constexpr char kDigitsMlpSpec[] = R"pb(
  name: "digits_mlp"
  input_features: 64
  layers { linear { out_features: 24 } }
  layers { relu {} }
  layers { linear { out_features: 24 } }
  layers { gelu {} }
  layers { linear { out_features: 24 } }
  layers { relu {} }
  layers { layer_norm {} }
  layers { linear { out_features: 20 } }
  layers { relu {} }
  layers { linear { out_features: 20 } }
  layers { gelu {} }
  layers { linear { out_features: 16 } }
  layers { relu {} }
  layers { linear { out_features: 16 } }
  layers { relu {} }
  layers { linear { out_features: 16 } }
  layers { relu {} }
  layers { linear { out_features: 10 } }
  loss { softmax_cross_entropy {} }
)pb";
constexpr int kDigitsMlpLayers = 18;

// The small char GPT of tests/common/model/test_models.h with six blocks (9 layers).
constexpr char kGptSpec[] = R"pb(
  name: "gpt"
  input_features: 1
  layers { embedding { vocab_size: 11 dim: 8 context: 4 } }
  layers { transformer_block { heads: 2 } }
  layers { transformer_block { heads: 2 } }
  layers { transformer_block { heads: 2 } }
  layers { transformer_block { heads: 2 } }
  layers { transformer_block { heads: 2 } }
  layers { transformer_block { heads: 2 } }
  layers { layer_norm {} }
  layers { linear { out_features: 11 } }
  loss { softmax_cross_entropy {} }
)pb";
constexpr int kGptLayers = 9;

// kGptSpec with a tied input/output embedding (the head without bias shares the token table):
// where chunk 0 and the last chunk are on two workers they exchange their parts of its gradient.
constexpr char kTiedGptSpec[] = R"pb(
  name: "tied_gpt"
  input_features: 1
  layers { embedding { vocab_size: 11 dim: 8 context: 4 } }
  layers { transformer_block { heads: 2 } }
  layers { transformer_block { heads: 2 } }
  layers { transformer_block { heads: 2 } }
  layers { transformer_block { heads: 2 } }
  layers { transformer_block { heads: 2 } }
  layers { transformer_block { heads: 2 } }
  layers { layer_norm {} }
  layers { linear { out_features: 11 no_bias: true } }
  loss { softmax_cross_entropy {} }
  tie_embeddings: true
)pb";

constexpr uint64_t kSeed = 7;
constexpr int64_t kSamples = 16;  // per batch: divisible by every M used here.

// Process-wide numerics settings every process of a pipeline must share (as the worker's and the
// reference's main() do), set once before any thread runs an Eigen product.
class NumericsEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    math::PinEigenBlockingForReproducibility();
    Eigen::setNbThreads(1);
  }
};
[[maybe_unused]] const ::testing::Environment* const kNumerics =
    ::testing::AddGlobalTestEnvironment(new NumericsEnvironment);

math::OptimizerConfig Optimizer(math::OptimizerKind kind) {
  math::OptimizerConfig o;
  o.kind = kind;
  o.lr = kind == math::OptimizerKind::kSgd ? 0.1f : 1e-2f;
  o.momentum = kind == math::OptimizerKind::kSgd ? 0.9f : 0.0f;
  o.weight_decay = 0.01f;
  o.clip_norm = 0.05f;  // small enough to be active
  return o;
}

uint32_t Bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}
uint64_t Bits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

void ExpectBitwiseEqual(const std::map<std::string, math::Tensor>& got,
                        const std::map<std::string, math::Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << "missing tensor " << name;
    ASSERT_EQ(it->second.shape, t.shape) << name;
    EXPECT_EQ(0, std::memcmp(it->second.data.data(), t.data.data(), t.data.size() * sizeof(float)))
        << "tensor " << name << " differs";
  }
}

// Tells, without polling, when every worker of a step has either returned or is blocked on a
// key that nobody will put any more. Workers send synchronously (InMemorySender calls Put on the
// compute thread), and Mailbox reports the end of a wait from inside the delivering Put, so a
// worker is counted as unblocked before its sender can block in turn: "all running workers
// blocked" with no outside Put pending is a real deadlock.
class DeadlockDetector : public MailboxObserver {
 public:
  void OnWaitStart(const TensorKey& key) override {
    absl::MutexLock lock(&mu_);
    ++blocked_;
  }
  void OnWaitEnd(const TensorKey& key) override {
    absl::MutexLock lock(&mu_);
    --blocked_;
  }
  // Before the workers start.
  void Arm(int workers) {
    absl::MutexLock lock(&mu_);
    running_ = workers;
  }
  // By each worker thread after its RunStep returned.
  void WorkerDone() {
    absl::MutexLock lock(&mu_);
    --running_;
  }
  // Once the coordinator has put everything it will put: blocks until the step settles and
  // returns true if it settled in a deadlock.
  bool AwaitDoneOrDeadlock() {
    absl::MutexLock lock(&mu_);
    auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return blocked_ == running_; };
    mu_.Await(absl::Condition(&settled));
    return running_ > 0;
  }

 private:
  // Protects both counters.
  absl::Mutex mu_;
  int blocked_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
};

// Delivers a worker's outgoing tensors straight into the mailbox of the chunk's owner. Used by
// one compute thread.
class InMemorySender : public Sender {
 public:
  InMemorySender(const schedule::Placement* placement,
                 const std::vector<std::unique_ptr<Mailbox>>* mailboxes)
      : placement_(placement), mailboxes_(mailboxes) {}

  void Send(const TensorKey& key, math::Matrix tensor) override {
    const absl::Status s =
        (*mailboxes_)[placement_->OwnerOf(key.chunk)]->Put(key, std::move(tensor));
    // A Put into an aborted mailbox is the expected end of an aborted step.
    if (!s.ok() && s.code() != absl::StatusCode::kAborted) ADD_FAILURE() << s;
  }

 private:
  const schedule::Placement* const placement_;
  const std::vector<std::unique_ptr<Mailbox>>* const mailboxes_;
};

// S workers and the coordinator's part of a step.
class Pipeline {
 public:
  static std::unique_ptr<Pipeline> Create(const model::Model* model, ScheduleKind kind, int stages,
                                          int virtual_stages, int microbatches,
                                          const math::OptimizerConfig& optimizer) {
    auto p = std::unique_ptr<Pipeline>(new Pipeline(model, optimizer));
    absl::StatusOr<schedule::Plan> plan =
        schedule::GenerateSchedule({kind, stages, microbatches, virtual_stages});
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return nullptr;
    EXPECT_TRUE(schedule::ValidatePlan(*plan).ok());
    p->plan_ = std::move(*plan);
    // Cut the layers into S*V chunks with the partitioner, weighted by FLOPs per micro-batch;
    // under dualpipe into S stages, chunk S+k (the up copy's stage k) repeating chunk k.
    const bool two_copies = p->plan_.placement.kind == schedule::PlacementKind::kBidirectional;
    partition::PartitionOptions po;
    po.stages = stages;
    po.placement = two_copies ? schedule::PlacementKind::kLinear : p->plan_.placement.kind;
    po.virtual_stages = two_copies ? 1 : virtual_stages;
    absl::StatusOr<partition::Partition> cut =
        partition::PartitionLayers(model->LayerFlops(kSamples / microbatches), po);
    EXPECT_TRUE(cut.ok()) << cut.status();
    if (!cut.ok()) return nullptr;
    p->boundaries_ = cut->boundaries;
    std::vector<std::pair<int, int>> layers;  // [chunk] -> [first, last).
    for (int c = 0; c < p->plan_.num_chunks(); ++c) {
      const int k = two_copies ? c % stages : c;
      layers.emplace_back(p->boundaries_[k], p->boundaries_[k + 1]);
    }
    for (int w = 0; w < stages; ++w) {
      p->mailboxes_.push_back(std::make_unique<Mailbox>(MailboxOptions{0, &p->detector_}));
    }
    for (int w = 0; w < stages; ++w) {
      p->senders_.push_back(std::make_unique<InMemorySender>(&p->plan_.placement, &p->mailboxes_));
      std::vector<OwnedChunk> chunks;
      for (int c : p->plan_.placement.ChunksOf(w)) {
        absl::StatusOr<model::Stage> stage =
            model::Stage::Create(model, layers[c].first, layers[c].second, kSeed, optimizer);
        EXPECT_TRUE(stage.ok()) << stage.status();
        if (!stage.ok()) return nullptr;
        chunks.push_back(OwnedChunk{c, std::move(*stage)});
      }
      ExecutorOptions options;
      options.two_copies = two_copies;
      absl::StatusOr<std::unique_ptr<StepExecutor>> e =
          StepExecutor::Create(model, std::move(chunks), p->plan_.num_chunks(),
                               p->mailboxes_[w].get(), p->senders_[w].get(), options);
      EXPECT_TRUE(e.ok()) << e.status();
      if (!e.ok()) return nullptr;
      p->executors_.push_back(std::move(*e));
    }
    return p;
  }

  struct RunOutcome {
    std::vector<absl::StatusOr<StepReport>> reports;  // [worker]
    bool deadlocked = false;
  };

  // Runs step `step` with per-worker `actions` on one thread per worker, feeding the inputs and
  // targets of micro-batches [0, feed) of `batch`. A deadlock aborts every mailbox (ABORTED).
  RunOutcome Run(int64_t step, const io::Batch& batch, int feed,
                 const std::vector<std::vector<Action>>& actions) {
    const int s = plan_.stages();
    const int64_t rows = batch.inputs.rows();
    const int64_t mb_rows = rows / plan_.microbatches;
    RunOutcome out;
    out.reports.assign(s, absl::UnknownError("not run"));
    detector_.Arm(s);
    std::vector<std::thread> threads;
    for (int w = 0; w < s; ++w) {
      threads.emplace_back([this, w, step, rows, &actions, &out] {
        out.reports[w] = executors_[w]->RunStep(step, actions[w], rows);
        detector_.WorkerDone();
      });
    }
    for (int mb = 0; mb < feed; ++mb) {
      // The micro-batch's route: every chunk, or under dualpipe one copy's.
      const int first = plan_.RouteBegin(mb);
      const int last = plan_.RouteEnd(mb) - 1;
      const TensorKey in{step, mb, first, TensorKind::kInput};
      const TensorKey target{step, mb, last, TensorKind::kTarget};
      EXPECT_TRUE(mailboxes_[plan_.placement.OwnerOf(first)]
                      ->Put(in, batch.inputs.middleRows(mb * mb_rows, mb_rows))
                      .ok());
      EXPECT_TRUE(mailboxes_[plan_.placement.OwnerOf(last)]
                      ->Put(target, batch.targets.middleRows(mb * mb_rows, mb_rows))
                      .ok());
    }
    out.deadlocked = detector_.AwaitDoneOrDeadlock();
    if (out.deadlocked) {
      for (auto& m : mailboxes_) {
        m->Abort(absl::AbortedError(absl::StrCat("step ", step, " deadlocked")));
      }
    }
    for (std::thread& t : threads) t.join();
    return out;
  }

  // One training step as the coordinator runs it: every worker runs the plan, then the loss is
  // the float sum of the micro-batch losses in increasing order, the gradient norm the sum of
  // per-layer norms in increasing layer order, and every worker commits with the clip scale.
  absl::StatusOr<model::StepResult> TrainStep(int64_t step, const io::Batch& batch) {
    RunOutcome out = Run(step, batch, plan_.microbatches, plan_.actions);
    if (out.deadlocked) return absl::InternalError("the plan deadlocked");
    std::vector<const StepReport*> reports;
    for (int w = 0; w < plan_.stages(); ++w) {
      if (!out.reports[w].ok()) return out.reports[w].status();
      CheckReport(*out.reports[w], plan_.actions[w]);
      reports.push_back(&*out.reports[w]);
    }
    model::StepResult result;
    // Each micro-batch's loss comes from the owner of its route's last chunk (two owners under
    // dualpipe), summed in micro-batch order.
    std::set<int> loss_owners;
    for (int mb = 0; mb < plan_.microbatches; ++mb) {
      const int owner = plan_.placement.OwnerOf(plan_.RouteEnd(mb) - 1);
      loss_owners.insert(owner);
      EXPECT_EQ(reports[owner]->microbatch_losses.size(), static_cast<size_t>(plan_.microbatches));
      if (reports[owner]->microbatch_losses.size() != static_cast<size_t>(plan_.microbatches)) {
        return absl::InternalError("missing micro-batch losses");
      }
      result.microbatch_losses.push_back(reports[owner]->microbatch_losses[mb]);
      result.loss += result.microbatch_losses.back();
    }
    for (int w = 0; w < plan_.stages(); ++w) {
      if (loss_owners.count(w) == 0) {
        EXPECT_TRUE(reports[w]->microbatch_losses.empty());
      }
    }
    if (optimizer_.clip_norm > 0) {
      absl::StatusOr<double> norm = CombineLayerNormSq(reports, model_->num_layers());
      if (!norm.ok()) return norm.status();
      result.grad_norm_sq = *norm;
      result.clip_scale = math::ClipScale(result.grad_norm_sq, optimizer_.clip_norm);
    } else {
      // Without clipping nothing reads the norms, and the workers do not take them.
      for (const StepReport* r : reports) EXPECT_TRUE(r->layer_grad_norm_sq.empty());
      result.clip_scale = 1.0f;
    }
    result.step = ++committed_;
    // Odd workers defer their update to their next step (as a worker whose step starts by
    // waiting for a peer does), even ones apply it at once: both must give the same bits.
    for (size_t w = 0; w < executors_.size(); ++w) {
      PT_RETURN_IF_ERROR(executors_[w]->Commit(committed_, result.clip_scale, w % 2 == 1));
    }
    for (auto& m : mailboxes_) {
      EXPECT_EQ(m->size(), 0) << "leftover tensors after step " << step;
      m->ClearStep(step);
    }
    return result;
  }

  // A forward-only pass (what the coordinator's Evaluate runs) whose keys start at mailbox step
  // `step`, `per_step` micro-batches per step (wire::EvalKey), over `batch` split into chunks of
  // `chunk` samples (the last may be smaller): each worker's RunForward on its own thread.
  // Returns the last chunk owner's report.
  absl::StatusOr<EvalReport> Evaluate(int64_t step, const io::Batch& batch, int64_t chunk,
                                      int per_step) {
    const int s = plan_.stages();
    const int last = plan_.RouteEnd(0) - 1;  // evaluation runs through one copy.
    const int64_t per_sample = model_->tokens_per_sample();
    std::vector<int64_t> rows;
    for (int64_t begin = 0; begin < batch.samples; begin += chunk) {
      rows.push_back(std::min(chunk, batch.samples - begin) * per_sample);
    }
    std::vector<absl::StatusOr<EvalReport>> reports(s, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int w = 0; w < s; ++w) {
      threads.emplace_back([this, w, step, per_step, &rows, &reports] {
        reports[w] = executors_[w]->RunForward(step, rows, per_step);
      });
    }
    int64_t row = 0;
    for (size_t mb = 0; mb < rows.size(); ++mb) {
      const int m = static_cast<int>(mb);
      EXPECT_TRUE(mailboxes_[plan_.placement.OwnerOf(0)]
                      ->Put(wire::EvalKey(step, m, per_step, 0, TensorKind::kInput),
                            batch.inputs.middleRows(row, rows[mb]))
                      .ok());
      EXPECT_TRUE(mailboxes_[plan_.placement.OwnerOf(last)]
                      ->Put(wire::EvalKey(step, m, per_step, last, TensorKind::kTarget),
                            batch.targets.middleRows(row, rows[mb]))
                      .ok());
      row += rows[mb];
    }
    for (std::thread& t : threads) t.join();
    for (int w = 0; w < s; ++w) {
      if (!reports[w].ok()) return reports[w].status();
      EXPECT_EQ(mailboxes_[w]->size(), 0) << "leftover tensors after evaluation " << step;
    }
    const int owner = plan_.placement.OwnerOf(last);
    for (int w = 0; w < s; ++w) {
      if (w != owner) {
        EXPECT_TRUE(reports[w]->loss_sums.empty());
      }
    }
    return std::move(reports[owner]);
  }

  // Opens generate request `request` for `sequences` sequences on every worker.
  absl::Status StartDecode(int64_t request, int64_t sequences) {
    for (auto& e : executors_) PT_RETURN_IF_ERROR(e->StartDecode(request, sequences));
    return absl::OkStatus();
  }

  // A decode round (what the coordinator's Generate runs per token) whose keys start at mailbox
  // step `step`: micro-batch i is `runs[i]`, fed `tokens[i]` as chunk 0's input; each worker's
  // RunDecode on its own thread. Returns the last chunk owner's report.
  absl::StatusOr<DecodeReport> Decode(int64_t request, int64_t step,
                                      const std::vector<DecodeMicrobatch>& runs,
                                      const std::vector<std::vector<int64_t>>& tokens,
                                      int per_step) {
    const int s = plan_.stages();
    std::vector<absl::StatusOr<DecodeReport>> reports(s, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int w = 0; w < s; ++w) {
      threads.emplace_back([this, w, request, step, per_step, &runs, &reports] {
        reports[w] = executors_[w]->RunDecode(request, step, runs, per_step);
      });
    }
    for (size_t mb = 0; mb < runs.size(); ++mb) {
      math::Matrix x(static_cast<int64_t>(tokens[mb].size()), 1);
      for (size_t i = 0; i < tokens[mb].size(); ++i) x(static_cast<int64_t>(i), 0) = tokens[mb][i];
      EXPECT_TRUE(
          mailboxes_[plan_.placement.OwnerOf(0)]
              ->Put(wire::EvalKey(step, static_cast<int>(mb), per_step, 0, TensorKind::kInput),
                    std::move(x))
              .ok());
    }
    for (std::thread& t : threads) t.join();
    for (int w = 0; w < s; ++w) {
      if (!reports[w].ok()) return reports[w].status();
      EXPECT_EQ(mailboxes_[w]->size(), 0) << "leftover tensors after decode round " << step;
    }
    return std::move(reports[plan_.placement.OwnerOf(plan_.RouteEnd(0) - 1)]);
  }

  int64_t DecodeBytes() const {
    int64_t bytes = 0;
    for (const auto& e : executors_) bytes += e->DecodeBytes();
    return bytes;
  }

  // What the coordinator does on Abort(step): every worker discards the step.
  void AbortStep() {
    for (auto& e : executors_) e->Abort();
    for (auto& m : mailboxes_) m->Reset();
  }

  std::map<std::string, math::Tensor> ExportState() const {
    std::map<std::string, math::Tensor> all;
    for (const auto& e : executors_) all.merge(e->ExportState());
    return all;
  }

  double GradNormSq() const {
    double sum = 0;
    for (const auto& e : executors_) {
      for (const LayerNormSq& n : e->GradNormSqPerLayer()) sum += n.norm_sq;
    }
    return sum;
  }

  const schedule::Plan& plan() const { return plan_; }
  StepExecutor& executor(int w) { return *executors_[w]; }

 private:
  Pipeline(const model::Model* model, const math::OptimizerConfig& optimizer)
      : model_(model), optimizer_(optimizer) {}

  // Every action timed once, in order, with start <= ready <= end and no overlap; its output
  // handed on at its end, or for a B (which then adds its weight gradients) between ready and end.
  static void CheckReport(const StepReport& r, const std::vector<Action>& actions) {
    ASSERT_EQ(r.timings.size(), actions.size());
    absl::Duration prev_end = absl::ZeroDuration();
    absl::Duration wait, compute;
    for (size_t i = 0; i < actions.size(); ++i) {
      const ActionTiming& t = r.timings[i];
      EXPECT_EQ(t.action, actions[i]);
      EXPECT_LE(prev_end, t.start);
      EXPECT_LE(t.start, t.ready);
      EXPECT_LE(t.ready, t.end);
      if (t.action.op == schedule::Op::kBackward) {
        EXPECT_LE(t.ready, t.output);
        EXPECT_LE(t.output, t.end);
      } else {
        EXPECT_EQ(t.output, t.end);
      }
      prev_end = t.end;
      wait += t.wait();
      compute += t.compute();
    }
    EXPECT_EQ(r.wait_time, wait);
    EXPECT_EQ(r.compute_time, compute);
    EXPECT_LE(prev_end, r.wall_time);
    EXPECT_GE(r.peak_in_flight, 1);
  }

  const model::Model* const model_;
  const math::OptimizerConfig optimizer_;
  schedule::Plan plan_;
  std::vector<int> boundaries_;
  DeadlockDetector detector_;  // before the mailboxes that point to it.
  std::vector<std::unique_ptr<Mailbox>> mailboxes_;
  std::vector<std::unique_ptr<InMemorySender>> senders_;
  std::vector<std::unique_ptr<StepExecutor>> executors_;
  int64_t committed_ = 0;
};

model::TrainerOptions ReferenceOptions(int microbatches, math::OptimizerKind kind) {
  model::TrainerOptions o;
  o.microbatches = microbatches;
  o.threads = 1;
  o.seed = kSeed;
  o.optimizer = Optimizer(kind);
  return o;
}

void ExpectSameStep(const model::StepResult& got, const model::StepResult& want, int step) {
  SCOPED_TRACE(absl::StrCat("step ", step));
  EXPECT_EQ(got.step, want.step);
  EXPECT_EQ(Bits(got.loss), Bits(want.loss)) << got.loss << " vs " << want.loss;
  ASSERT_EQ(got.microbatch_losses.size(), want.microbatch_losses.size());
  for (size_t i = 0; i < got.microbatch_losses.size(); ++i) {
    EXPECT_EQ(Bits(got.microbatch_losses[i]), Bits(want.microbatch_losses[i])) << "mb " << i;
  }
  EXPECT_EQ(Bits(got.grad_norm_sq), Bits(want.grad_norm_sq));
  EXPECT_EQ(Bits(got.clip_scale), Bits(want.clip_scale));
}

// ---------------------------------------------------------------------------------------------
// The central test: every schedule kind, S = 2 and 4, both optimizers, both models.

struct PipelineConfig {
  std::string model_name;
  const char* spec = nullptr;
  ScheduleKind kind = ScheduleKind::kGPipe;
  int stages = 1;
  int virtual_stages = 1;
  int microbatches = 1;
  math::OptimizerKind optimizer = math::OptimizerKind::kSgd;
};

std::string ConfigName(const ::testing::TestParamInfo<PipelineConfig>& info) {
  const PipelineConfig& c = info.param;
  std::string kind(schedule::ScheduleKindName(c.kind));
  kind = absl::StrReplaceAll(kind, {{"-", "_"}});
  return absl::StrCat(c.model_name, "_", kind, "_S", c.stages, "V", c.virtual_stages, "M",
                      c.microbatches, "_",
                      c.optimizer == math::OptimizerKind::kSgd ? "sgd" : "adamw");
}

std::vector<PipelineConfig> AllConfigs() {
  struct KindV {
    ScheduleKind kind;
    int v;
  };
  const std::vector<KindV> kinds = {{ScheduleKind::kGPipe, 1},
                                    {ScheduleKind::kOneFOneB, 1},
                                    {ScheduleKind::kInterleaved, 2},
                                    {ScheduleKind::kInterleaved, 3},
                                    {ScheduleKind::kZbH1, 1},
                                    {ScheduleKind::kZbV, 2},
                                    {ScheduleKind::kDualPipeV, 2},
                                    {ScheduleKind::kOneFOneBOverlap, 1},
                                    {ScheduleKind::kInterleavedOverlap, 2},
                                    {ScheduleKind::kDualPipe, 2}};
  struct ModelDef {
    const char* name;
    const char* spec;
    int layers;
  };
  const std::vector<ModelDef> models = {{"mlp", kDigitsMlpSpec, kDigitsMlpLayers},
                                        {"gpt", kGptSpec, kGptLayers},
                                        {"tiedgpt", kTiedGptSpec, kGptLayers}};
  std::vector<PipelineConfig> out;
  for (const ModelDef& m : models) {
    for (const KindV& k : kinds) {
      for (int s : {2, 4}) {
        // dualpipe cuts the layers into S stages (two copies of each).
        if (s * (k.kind == ScheduleKind::kDualPipe ? 1 : k.v) > m.layers) continue;
        for (auto opt : {math::OptimizerKind::kSgd, math::OptimizerKind::kAdamW}) {
          out.push_back({m.name, m.spec, k.kind, s, k.v, s == 2 ? 4 : 8, opt});
        }
      }
    }
    // One worker holding everything, and one holding two chunks that talk to each other.
    out.push_back({m.name, m.spec, ScheduleKind::kGPipe, 1, 1, 4, math::OptimizerKind::kAdamW});
    out.push_back(
        {m.name, m.spec, ScheduleKind::kInterleaved, 1, 2, 4, math::OptimizerKind::kAdamW});
  }
  return out;
}

class PipelineBitwiseTest : public ::testing::TestWithParam<PipelineConfig> {};

TEST_P(PipelineBitwiseTest, LossesAndFinalStateEqualTheReference) {
  const PipelineConfig& c = GetParam();
  auto model = model::testing::BuildOrDie(c.spec);
  auto reference =
      model::ReferenceTrainer::Create(model.get(), ReferenceOptions(c.microbatches, c.optimizer));
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::unique_ptr<Pipeline> pipeline = Pipeline::Create(
      model.get(), c.kind, c.stages, c.virtual_stages, c.microbatches, Optimizer(c.optimizer));
  ASSERT_NE(pipeline, nullptr);
  bool clipped = false;
  for (int step = 1; step <= 3; ++step) {
    const io::Batch batch = model::testing::MakeBatch(*model, kSamples, step);
    absl::StatusOr<model::StepResult> want = (*reference)->Step(batch);
    ASSERT_TRUE(want.ok()) << want.status();
    absl::StatusOr<model::StepResult> got = pipeline->TrainStep(step, batch);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSameStep(*got, *want, step);
    clipped = clipped || want->clip_scale < 1.0f;
  }
  EXPECT_TRUE(clipped) << "clipping was never active";
  ExpectBitwiseEqual(pipeline->ExportState(), (*reference)->ExportState());
}

INSTANTIATE_TEST_SUITE_P(AllSchedules, PipelineBitwiseTest, ::testing::ValuesIn(AllConfigs()),
                         ConfigName);

// Under dualpipe every stage has two copies, on ranks k and S-1-k, each adding the gradients of
// half the micro-batches; after the copies' exchange both apply the same update, so after every
// step the two copies of every tensor are bit for bit the same (and the reference's).
TEST(DualPipeCopiesTest, BothCopiesOfEveryStageStayBitwiseEqual) {
  auto model = model::testing::BuildOrDie(kTiedGptSpec);
  const auto opt = math::OptimizerKind::kAdamW;
  auto reference = model::ReferenceTrainer::Create(model.get(), ReferenceOptions(8, opt));
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::unique_ptr<Pipeline> p =
      Pipeline::Create(model.get(), ScheduleKind::kDualPipe, 4, 2, 8, Optimizer(opt));
  ASSERT_NE(p, nullptr);
  for (int step = 1; step <= 2; ++step) {
    const io::Batch batch = model::testing::MakeBatch(*model, kSamples, step);
    absl::StatusOr<model::StepResult> got = p->TrainStep(step, batch);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSameStep(*got, *(*reference)->Step(batch), step);
    std::map<std::string, int> copies;  // tensor name -> executors holding it.
    std::vector<std::map<std::string, math::Tensor>> states;
    for (int w = 0; w < 4; ++w) states.push_back(p->executor(w).ExportState());
    const std::map<std::string, math::Tensor> want = (*reference)->ExportState();
    for (int w = 0; w < 4; ++w) {
      for (const auto& [name, t] : states[w]) {
        ++copies[name];
        ASSERT_EQ(want.count(name), 1u) << name;
        EXPECT_EQ(
            0, std::memcmp(t.data.data(), want.at(name).data.data(), t.data.size() * sizeof(float)))
            << "rank " << w << "'s copy of " << name << " after step " << step;
      }
    }
    for (const auto& [name, n] : copies) EXPECT_EQ(n, 2) << name << " is not held twice";
  }
}

// Without clipping the workers report no gradient norms (StepReport::layer_grad_norm_sq) and every
// step's losses, and the final state, are still those of the reference.
TEST(PipelineWithoutClippingTest, ReportsNoNormsAndEqualsTheReference) {
  auto model = model::testing::BuildOrDie(kDigitsMlpSpec);
  struct Case {
    ScheduleKind kind;
    int virtual_stages;
  };
  for (const Case& c : {Case{ScheduleKind::kOneFOneB, 1}, Case{ScheduleKind::kInterleaved, 2},
                        Case{ScheduleKind::kZbV, 2}}) {
    SCOPED_TRACE(schedule::ScheduleKindName(c.kind));
    model::TrainerOptions o = ReferenceOptions(4, math::OptimizerKind::kSgd);
    o.optimizer.clip_norm = 0.0f;
    auto reference = model::ReferenceTrainer::Create(model.get(), o);
    ASSERT_TRUE(reference.ok()) << reference.status();
    std::unique_ptr<Pipeline> pipeline =
        Pipeline::Create(model.get(), c.kind, 2, c.virtual_stages, 4, o.optimizer);
    ASSERT_NE(pipeline, nullptr);
    for (int step = 1; step <= 3; ++step) {
      const io::Batch batch = model::testing::MakeBatch(*model, kSamples, step);
      absl::StatusOr<model::StepResult> want = (*reference)->Step(batch);
      ASSERT_TRUE(want.ok()) << want.status();
      absl::StatusOr<model::StepResult> got = pipeline->TrainStep(step, batch);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(Bits(got->loss), Bits(want->loss)) << "step " << step;
      EXPECT_EQ(Bits(got->clip_scale), Bits(want->clip_scale)) << "step " << step;
    }
    ExpectBitwiseEqual(pipeline->ExportState(), (*reference)->ExportState());
  }
}

// ---------------------------------------------------------------------------------------------
// Evaluation: a forward-only pass over the pipeline equals ReferenceTrainer::Evaluate bitwise.

// `batch` as the held-out split of a data set (and its training split), for the reference.
class BatchDataset : public io::Dataset {
 public:
  BatchDataset(const model::Model& model, io::Batch batch) : batch_(std::move(batch)) {
    info_.name = "batch";
    info_.input_features = batch_.inputs.cols();
    info_.target_features = batch_.targets.cols();
    info_.tokens_per_sample = model.tokens_per_sample();
  }
  const io::DatasetInfo& info() const override { return info_; }
  int64_t size(io::Split) const override { return batch_.samples; }
  void GetSample(io::Split, int64_t index, float* inputs, float* targets) const override {
    const int64_t t = info_.tokens_per_sample;
    std::memcpy(inputs, batch_.inputs.data() + index * t * info_.input_features,
                sizeof(float) * t * info_.input_features);
    std::memcpy(targets, batch_.targets.data() + index * t * info_.target_features,
                sizeof(float) * t * info_.target_features);
  }

 private:
  io::Batch batch_;
  io::DatasetInfo info_;
};

TEST(PipelineEvaluateTest, ForwardOnlyPassEqualsTheReferenceEvaluationBitwise) {
  struct Case {
    const char* spec;
    ScheduleKind kind;
    int stages;
    int virtual_stages;
  };
  for (const Case& c : {Case{kDigitsMlpSpec, ScheduleKind::kOneFOneB, 2, 1},
                        Case{kDigitsMlpSpec, ScheduleKind::kInterleaved, 2, 2},
                        Case{kDigitsMlpSpec, ScheduleKind::kZbV, 2, 2},
                        Case{kGptSpec, ScheduleKind::kOneFOneB, 4, 1},
                        Case{kGptSpec, ScheduleKind::kInterleaved, 1, 2}}) {
    SCOPED_TRACE(
        absl::StrCat(schedule::ScheduleKindName(c.kind), " S", c.stages, " V", c.virtual_stages));
    auto model = model::testing::BuildOrDie(c.spec);
    const model::TrainerOptions o = ReferenceOptions(4, math::OptimizerKind::kAdamW);
    auto reference = model::ReferenceTrainer::Create(model.get(), o);
    ASSERT_TRUE(reference.ok()) << reference.status();
    std::unique_ptr<Pipeline> pipeline =
        Pipeline::Create(model.get(), c.kind, c.stages, c.virtual_stages, 4, o.optimizer);
    ASSERT_NE(pipeline, nullptr);
    for (int step = 1; step <= 2; ++step) {  // trained weights, the last update deferred on odd.
      const io::Batch batch = model::testing::MakeBatch(*model, kSamples, step);
      ASSERT_TRUE((*reference)->Step(batch).ok());
      ASSERT_TRUE(pipeline->TrainStep(step, batch).ok());
    }
    constexpr int64_t kHeldOut = 23;  // chunks of 5: four whole ones and a last of 3.
    constexpr int64_t kChunk = 5;
    const BatchDataset data(*model, model::testing::MakeBatch(*model, kHeldOut, 99));
    absl::StatusOr<model::EvalResult> want = (*reference)->Evaluate(data, 0, kChunk);
    ASSERT_TRUE(want.ok()) << want.status();
    // Five chunks, keyed over three mailbox steps of two micro-batches each.
    absl::StatusOr<EvalReport> got = pipeline->Evaluate(
        wire::kEvalStepBase, io::MakeEvalBatch(data, 0, kHeldOut), kChunk, /*per_step=*/2);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->loss_sums.size(), 5u);
    double loss_sum = 0;
    int64_t correct = 0;
    for (size_t i = 0; i < got->loss_sums.size(); ++i) {
      loss_sum += got->loss_sums[i];
      correct += got->correct[i];
    }
    EXPECT_EQ(Bits(loss_sum / static_cast<double>(want->rows)), Bits(want->loss));
    EXPECT_EQ(correct, want->correct);
    // Nothing changed: training continues as the reference does.
    const io::Batch batch = model::testing::MakeBatch(*model, kSamples, 3);
    absl::StatusOr<model::StepResult> next = (*reference)->Step(batch);
    ASSERT_TRUE(next.ok());
    absl::StatusOr<model::StepResult> piped = pipeline->TrainStep(3, batch);
    ASSERT_TRUE(piped.ok()) << piped.status();
    EXPECT_EQ(Bits(piped->loss), Bits(next->loss));
    ExpectBitwiseEqual(pipeline->ExportState(), (*reference)->ExportState());
  }
}

TEST(PipelineEvaluateTest, RefusedWhileAStepAwaitsItsCommitAndForPartialSamples) {
  auto model = model::testing::BuildOrDie(kGptSpec);
  std::unique_ptr<Pipeline> pipeline = Pipeline::Create(model.get(), ScheduleKind::kGPipe, 1, 1, 4,
                                                        Optimizer(math::OptimizerKind::kSgd));
  ASSERT_NE(pipeline, nullptr);
  // 6 rows are not whole samples of 4 tokens.
  absl::StatusOr<EvalReport> r = pipeline->executor(0).RunForward(wire::kEvalStepBase, {8, 6}, 4);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("micro-batch 1 has 6 rows"));
  const io::Batch batch = model::testing::MakeBatch(*model, kSamples, 1);
  Pipeline::RunOutcome out = pipeline->Run(1, batch, 4, pipeline->plan().actions);
  ASSERT_TRUE(out.reports[0].ok()) << out.reports[0].status();
  r = pipeline->executor(0).RunForward(wire::kEvalStepBase, {8}, 4);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("awaits Commit or Abort"));
}

// ---------------------------------------------------------------------------------------------
// Decoding: a Generate request's incremental forward over the pipeline equals the one-process
// generator bitwise.

bool SameBits(absl::Span<const float> a, absl::Span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Three prompts decoded together (one micro-batch each per round, keyed over two mailbox steps),
// past several slides of the context-4 window, on trained weights (the last update deferred):
// every round's logits are bitwise the model::Generator's on the pipeline's exported weights, so
// the sampled tokens are the same; EndDecode frees the caches.
TEST(PipelineDecodeTest, IncrementalPipelineDecodingIsBitwiseTheLocalGenerator) {
  struct Case {
    ScheduleKind kind;
    int stages;
    int virtual_stages;
  };
  for (const Case& c : {Case{ScheduleKind::kOneFOneB, 4, 1}, Case{ScheduleKind::kInterleaved, 1, 2},
                        Case{ScheduleKind::kZbV, 2, 2}}) {
    SCOPED_TRACE(
        absl::StrCat(schedule::ScheduleKindName(c.kind), " S", c.stages, " V", c.virtual_stages));
    auto model = model::testing::BuildOrDie(kGptSpec);
    std::unique_ptr<Pipeline> pipeline = Pipeline::Create(
        model.get(), c.kind, c.stages, c.virtual_stages, 4, Optimizer(math::OptimizerKind::kAdamW));
    ASSERT_NE(pipeline, nullptr);
    for (int step = 1; step <= 2; ++step) {
      ASSERT_TRUE(
          pipeline->TrainStep(step, model::testing::MakeBatch(*model, kSamples, step)).ok());
    }
    std::map<std::string, math::Tensor> state = pipeline->ExportState();
    absl::StatusOr<model::ModelParams> params = model::TakeModelParams(*model, &state);
    ASSERT_TRUE(params.ok()) << params.status();
    const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {7}, {4, 4, 9, 10, 0, 5}};
    const model::SamplingOptions sampling{0.8, 5, 42};
    std::vector<std::unique_ptr<model::Generator>> generators;
    std::vector<model::DecodeWindow> windows(prompts.size(), model::DecodeWindow(4, 11));
    std::vector<model::TokenSampler> samplers(prompts.size(), model::TokenSampler(sampling));
    std::vector<model::DecodeRun> runs;
    for (size_t p = 0; p < prompts.size(); ++p) {
      auto g = model::Generator::Create(model.get(), &*params);
      ASSERT_TRUE(g.ok()) << g.status();
      generators.push_back(std::move(g).value());
      ASSERT_TRUE(generators[p]->Start(prompts[p]).ok());
      runs.push_back(windows[p].Start(prompts[p]).value());
    }
    ASSERT_TRUE(pipeline->StartDecode(9, 3).ok());
    for (int64_t round = 0; round < 10; ++round) {
      std::vector<DecodeMicrobatch> mbs;
      std::vector<std::vector<int64_t>> tokens;
      for (size_t p = 0; p < prompts.size(); ++p) {
        const absl::Span<const int64_t> t = windows[p].RunTokens(runs[p]);
        mbs.push_back(DecodeMicrobatch{static_cast<int64_t>(p), runs[p].position, runs[p].restart,
                                       static_cast<int64_t>(t.size())});
        tokens.emplace_back(t.begin(), t.end());
      }
      absl::StatusOr<DecodeReport> report =
          pipeline->Decode(9, wire::kEvalStepBase + 2 * round, mbs, tokens, /*per_step=*/2);
      ASSERT_TRUE(report.ok()) << report.status();
      ASSERT_EQ(report->logits.size(), prompts.size());
      for (size_t p = 0; p < prompts.size(); ++p) {
        ASSERT_TRUE(SameBits(report->logits[p], generators[p]->logits()))
            << "prompt " << p << " round " << round;
        const int64_t token = samplers[p].Next(report->logits[p]);
        ASSERT_TRUE(generators[p]->Append(token).ok());
        runs[p] = windows[p].Append(token).value();
      }
    }
    EXPECT_GE(windows[0].slides(), 3);
    EXPECT_GT(pipeline->DecodeBytes(), 0);
    for (int w = 0; w < c.stages; ++w) pipeline->executor(w).EndDecode();
    EXPECT_EQ(pipeline->DecodeBytes(), 0);
  }
}

TEST(PipelineDecodeTest, RefusedWithoutItsRequestForBadTokensAndOnANonLanguageModel) {
  auto model = model::testing::BuildOrDie(kGptSpec);
  std::unique_ptr<Pipeline> pipeline = Pipeline::Create(model.get(), ScheduleKind::kGPipe, 1, 1, 4,
                                                        Optimizer(math::OptimizerKind::kSgd));
  ASSERT_NE(pipeline, nullptr);
  StepExecutor& e = pipeline->executor(0);
  absl::StatusOr<DecodeReport> r = e.RunDecode(3, wire::kEvalStepBase, {{0, 0, true, 1}}, 4);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("no request is open"));
  EXPECT_EQ(e.StartDecode(0, 1).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(e.StartDecode(3, 2).ok());
  r = e.RunDecode(4, wire::kEvalStepBase, {{0, 0, true, 1}}, 4);
  EXPECT_THAT(r.status().message(), HasSubstr("request 3 is open"));
  r = pipeline->Decode(3, wire::kEvalStepBase, {{0, 0, true, 2}}, {{1, 11}}, 4);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("row 1: token 11 is not an id in [0, 11)"));
  r = pipeline->Decode(3, wire::kEvalStepBase + 1, {{1, 2, false, 1}}, {{1}}, 4);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("holds 0 positions, not 2"));
  e.Abort();  // frees the caches as EndDecode does.
  EXPECT_EQ(e.decode_request(), 0);

  auto mlp = model::testing::BuildOrDie(kDigitsMlpSpec);
  std::unique_ptr<Pipeline> classifier = Pipeline::Create(mlp.get(), ScheduleKind::kGPipe, 1, 1, 4,
                                                          Optimizer(math::OptimizerKind::kSgd));
  ASSERT_NE(classifier, nullptr);
  EXPECT_EQ(classifier->executor(0).StartDecode(1, 1).code(),
            absl::StatusCode::kFailedPrecondition);
}

// ---------------------------------------------------------------------------------------------
// Abort and failure behaviour.

// A step aborted midway (some micro-batches already accumulated their weight gradients) and
// re-run gives the same bits as a run that never failed.
class AbortTest : public ::testing::TestWithParam<ScheduleKind> {};

TEST_P(AbortTest, AbortedStepRerunEqualsACleanRun) {
  const ScheduleKind kind = GetParam();
  const int v = schedule::DefaultVirtualStages(kind);
  auto model = model::testing::BuildOrDie(kDigitsMlpSpec);
  const auto opt = math::OptimizerKind::kAdamW;
  auto reference = model::ReferenceTrainer::Create(model.get(), ReferenceOptions(4, opt));
  ASSERT_TRUE(reference.ok());
  std::unique_ptr<Pipeline> p = Pipeline::Create(model.get(), kind, 2, v, 4, Optimizer(opt));
  ASSERT_NE(p, nullptr);

  const io::Batch b1 = model::testing::MakeBatch(*model, kSamples, 1);
  absl::StatusOr<model::StepResult> r1 = p->TrainStep(1, b1);
  ASSERT_TRUE(r1.ok()) << r1.status();
  ExpectSameStep(*r1, *(*reference)->Step(b1), 1);
  // An Abort between steps discards nothing committed (worker 1 has step 1's update pending).
  p->AbortStep();

  // Step 2 with only three of four micro-batches fed: the workers finish what they can (some
  // weight gradients included), then all wait for micro-batch 3; the coordinator aborts.
  const io::Batch b2 = model::testing::MakeBatch(*model, kSamples, 2);
  Pipeline::RunOutcome partial = p->Run(2, b2, /*feed=*/3, p->plan().actions);
  ASSERT_TRUE(partial.deadlocked);
  for (const auto& r : partial.reports) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("step 2 deadlocked"));
  }
  EXPECT_GT(p->GradNormSq(), 0.0) << "no gradient was accumulated before the abort";
  // A failed step cannot be committed, and cannot be followed by another without Abort.
  EXPECT_EQ(p->executor(0).Commit(2, 1.0f).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p->executor(0).RunStep(2, p->plan().actions[0], b2.inputs.rows()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  p->AbortStep();
  EXPECT_EQ(p->GradNormSq(), 0.0);

  absl::StatusOr<model::StepResult> r2 = p->TrainStep(2, b2);
  ASSERT_TRUE(r2.ok()) << r2.status();
  ExpectSameStep(*r2, *(*reference)->Step(b2), 2);
  const io::Batch b3 = model::testing::MakeBatch(*model, kSamples, 3);
  absl::StatusOr<model::StepResult> r3 = p->TrainStep(3, b3);
  ASSERT_TRUE(r3.ok()) << r3.status();
  ExpectSameStep(*r3, *(*reference)->Step(b3), 3);
  ExpectBitwiseEqual(p->ExportState(), (*reference)->ExportState());
}

std::string KindName(const ::testing::TestParamInfo<ScheduleKind>& param) {
  return absl::StrReplaceAll(schedule::ScheduleKindName(param.param), {{"-", "_"}});
}

INSTANTIATE_TEST_SUITE_P(Kinds, AbortTest,
                         ::testing::Values(ScheduleKind::kOneFOneB, ScheduleKind::kZbV,
                                           ScheduleKind::kDualPipe),
                         KindName);

Action A(Op op, int mb, int chunk) { return Action{op, mb, chunk}; }

// Each worker's list is fine on its own, but together they wait on each other: worker 0 wants
// micro-batch 0's gradient before sending micro-batch 1's activation, which worker 1 wants first.
// The executors block, the (test) coordinator sees every worker blocked and aborts, and each
// error names the action and the tensor it was waiting for.
TEST(ExecutorTest, CrossWorkerDeadlockIsReportedNamingTheBlockedActions) {
  auto model = model::testing::BuildOrDie(kDigitsMlpSpec);
  const auto opt = math::OptimizerKind::kSgd;
  std::unique_ptr<Pipeline> p =
      Pipeline::Create(model.get(), ScheduleKind::kGPipe, 2, 1, 2, Optimizer(opt));
  ASSERT_NE(p, nullptr);
  const std::vector<std::vector<Action>> crossed = {
      {A(Op::kForward, 0, 0), A(Op::kBackward, 0, 0), A(Op::kForward, 1, 0),
       A(Op::kBackward, 1, 0)},
      {A(Op::kForward, 1, 1), A(Op::kForward, 0, 1), A(Op::kBackward, 0, 1),
       A(Op::kBackward, 1, 1)}};
  const io::Batch b1 = model::testing::MakeBatch(*model, kSamples, 1);
  Pipeline::RunOutcome out = p->Run(1, b1, 2, crossed);
  ASSERT_TRUE(out.deadlocked);
  ASSERT_FALSE(out.reports[0].ok());
  EXPECT_EQ(out.reports[0].status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(out.reports[0].status().message(), HasSubstr("position 1 B(mb=0, chunk=0)"));
  EXPECT_THAT(out.reports[0].status().message(),
              HasSubstr("waiting for gradient(step=1, mb=0, chunk=0)"));
  ASSERT_FALSE(out.reports[1].ok());
  EXPECT_THAT(out.reports[1].status().message(), HasSubstr("position 0 F(mb=1, chunk=1)"));
  EXPECT_THAT(out.reports[1].status().message(),
              HasSubstr("waiting for activation(step=1, mb=1, chunk=1)"));

  // After Abort the pipeline runs the real plan and matches the reference.
  p->AbortStep();
  auto reference = model::ReferenceTrainer::Create(model.get(), ReferenceOptions(2, opt));
  ASSERT_TRUE(reference.ok());
  absl::StatusOr<model::StepResult> got = p->TrainStep(1, b1);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameStep(*got, *(*reference)->Step(b1), 1);
}

// A Sender for a worker that holds every chunk (nothing leaves it).
class NoSender : public Sender {
 public:
  void Send(const TensorKey& key, math::Matrix tensor) override {
    ADD_FAILURE() << "unexpected send of " << key.ToString();
  }
};

// One worker holding the whole model, driven synchronously from the test thread.
class SingleWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = model::testing::BuildOrDie(kDigitsMlpSpec);
    std::vector<OwnedChunk> chunks;
    auto stage = model::Stage::Create(model_.get(), 0, model_->num_layers(), kSeed,
                                      Optimizer(math::OptimizerKind::kSgd));
    ASSERT_TRUE(stage.ok());
    chunks.push_back(OwnedChunk{0, std::move(*stage)});
    // Any unexpected wait fails the test instead of hanging it.
    auto e = StepExecutor::Create(model_.get(), std::move(chunks), 1, &mailbox_, &sender_,
                                  ExecutorOptions{absl::Seconds(30)});
    ASSERT_TRUE(e.ok()) << e.status();
    executor_ = std::move(*e);
  }

  // Puts the inputs and targets of `m` micro-batches of `batch` for `step`.
  void Feed(int64_t step, const io::Batch& batch, int m) {
    const int64_t rows = batch.inputs.rows() / m;
    for (int mb = 0; mb < m; ++mb) {
      ASSERT_TRUE(mailbox_
                      .Put(TensorKey{step, mb, 0, TensorKind::kInput},
                           batch.inputs.middleRows(mb * rows, rows))
                      .ok());
      ASSERT_TRUE(mailbox_
                      .Put(TensorKey{step, mb, 0, TensorKind::kTarget},
                           batch.targets.middleRows(mb * rows, rows))
                      .ok());
    }
  }

  std::unique_ptr<model::Model> model_;
  Mailbox mailbox_;
  NoSender sender_;
  std::unique_ptr<StepExecutor> executor_;
};

// Lists that are wrong on their own fail before any compute or wait, naming the action; the
// executor stays usable.
TEST_F(SingleWorkerTest, MalformedActionListsFailBeforeAnyCompute) {
  const Op F = Op::kForward, B = Op::kBackward, I = Op::kInputGrad, W = Op::kWeightGrad;
  struct Case {
    std::vector<Action> actions;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{}, "the action list is empty"},
      {{A(I, 0, 0), A(F, 0, 0), A(W, 0, 0)},
       "position 0 I(mb=0, chunk=0): runs before the forward"},
      {{A(F, 0, 0), A(W, 0, 0), A(I, 0, 0)}, "position 1 W(mb=0, chunk=0): runs before the I"},
      {{A(F, 0, 0), A(F, 0, 0), A(B, 0, 0)}, "position 1 F(mb=0, chunk=0): second forward"},
      {{A(F, 0, 0), A(B, 0, 0), A(B, 0, 0)}, "position 2 B(mb=0, chunk=0): second backward"},
      {{A(F, 0, 0), A(B, 0, 0), A(W, 0, 0)}, "position 2 W(mb=0, chunk=0): after a full B"},
      {{A(F, 0, 0), A(F, 1, 0), A(B, 1, 0), A(B, 0, 0)},
       "position 3 B(mb=0, chunk=0): accumulates weight gradients after micro-batch 1"},
      {{A(F, 0, 0), A(F, 1, 0), A(I, 0, 0), A(I, 1, 0), A(W, 1, 0), A(W, 0, 0)},
       "position 5 W(mb=0, chunk=0): accumulates weight gradients after micro-batch 1"},
      {{A(F, 0, 0), A(F, 1, 0), A(B, 0, 0)}, "no B or I(mb=1, chunk=0) after its F at position 1"},
      {{A(F, 0, 0), A(I, 0, 0)}, "no W(mb=0, chunk=0) after its I at position 1"},
      {{A(F, 1, 0), A(B, 1, 0)}, "no F(mb=0, chunk=0)"},
      {{A(F, 0, 1), A(B, 0, 1)}, "position 0 F(mb=0, chunk=1): chunk 1 is not held"},
      {{A(F, -1, 0), A(B, -1, 0)}, "micro-batch -1 is outside"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<StepReport> r = executor_->RunStep(5, c.actions, 16);
    ASSERT_FALSE(r.ok()) << c.message;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr(c.message));
    EXPECT_THAT(r.status().message(), HasSubstr("step 5"));
  }
  // Nothing was taken or left behind, and a correct list still runs.
  const io::Batch batch = model::testing::MakeBatch(*model_, 8, 0);
  Feed(5, batch, 2);
  const std::vector<Action> good = {A(F, 0, 0), A(F, 1, 0), A(I, 0, 0), A(W, 0, 0), A(B, 1, 0)};
  absl::StatusOr<StepReport> r = executor_->RunStep(5, good, batch.inputs.rows());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->microbatch_losses.size(), 2u);
  EXPECT_EQ(r->peak_in_flight, 2);
  EXPECT_EQ(mailbox_.size(), 0);
}

TEST_F(SingleWorkerTest, BatchRowsMustSplitIntoMicrobatches) {
  const std::vector<Action> actions = {A(Op::kForward, 0, 0), A(Op::kForward, 1, 0),
                                       A(Op::kBackward, 0, 0), A(Op::kBackward, 1, 0)};
  const absl::Status s = executor_->RunStep(1, actions, 7).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("batch of 7 rows does not split into 2 micro-batches"));
}

TEST_F(SingleWorkerTest, LifecycleCommitAndAbort) {
  const std::vector<Action> actions = {A(Op::kForward, 0, 0), A(Op::kForward, 1, 0),
                                       A(Op::kBackward, 0, 0), A(Op::kBackward, 1, 0)};
  const io::Batch batch = model::testing::MakeBatch(*model_, 8, 0);
  EXPECT_EQ(executor_->Commit(1, 1.0f).code(), absl::StatusCode::kFailedPrecondition);
  Feed(1, batch, 2);
  ASSERT_TRUE(executor_->RunStep(1, actions, batch.inputs.rows()).ok());
  const absl::Status again = executor_->RunStep(2, actions, batch.inputs.rows()).status();
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.message(), HasSubstr("awaits Commit or Abort"));
  EXPECT_EQ(executor_->Commit(0, 1.0f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(executor_->Commit(1, std::nanf("")).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(executor_->Commit(1, 0.0f).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(executor_->Commit(1, 1.0f).ok());
  EXPECT_EQ(executor_->Commit(1, 1.0f).code(), absl::StatusCode::kFailedPrecondition);

  // Abort after a successful step: gradients gone, parameters as before the step.
  const auto committed = executor_->ExportState();
  Feed(2, batch, 2);
  ASSERT_TRUE(executor_->RunStep(2, actions, batch.inputs.rows()).ok());
  double norm = 0;
  for (const LayerNormSq& n : executor_->GradNormSqPerLayer()) norm += n.norm_sq;
  EXPECT_GT(norm, 0.0);
  executor_->Abort();
  for (const LayerNormSq& n : executor_->GradNormSqPerLayer()) EXPECT_EQ(n.norm_sq, 0.0);
  ExpectBitwiseEqual(executor_->ExportState(), committed);
  EXPECT_EQ(executor_->Commit(2, 1.0f).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(SingleWorkerTest, EachStepReportsTheUpdateAppliedSinceThePreviousOne) {
  const std::vector<Action> actions = {A(Op::kForward, 0, 0), A(Op::kForward, 1, 0),
                                       A(Op::kBackward, 0, 0), A(Op::kBackward, 1, 0)};
  const io::Batch batch = model::testing::MakeBatch(*model_, 8, 0);
  auto run = [&](int64_t step) {
    Feed(step, batch, 2);
    return executor_->RunStep(step, actions, batch.inputs.rows());
  };
  absl::StatusOr<StepReport> first = run(1);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->update_time, absl::ZeroDuration());  // no update before the first step.
  // Applied at the Commit: the next step reports it, once.
  ASSERT_TRUE(executor_->Commit(1, 1.0f).ok());
  absl::StatusOr<StepReport> second = run(2);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_GT(second->update_time, absl::ZeroDuration());
  // Deferred to the next RunStep: reported by that step.
  ASSERT_TRUE(executor_->Commit(2, 1.0f, /*defer=*/true).ok());
  absl::StatusOr<StepReport> third = run(3);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_GT(third->update_time, absl::ZeroDuration());
  // An aborted step is not committed: the step after it had no update before it.
  executor_->Abort();
  absl::StatusOr<StepReport> fourth = run(3);
  ASSERT_TRUE(fourth.ok()) << fourth.status();
  EXPECT_EQ(fourth->update_time, absl::ZeroDuration());
}

TEST_F(SingleWorkerTest, MalformedTensorsAreInvalidArgumentNamingActionAndKey) {
  const std::vector<Action> actions = {A(Op::kForward, 0, 0), A(Op::kBackward, 0, 0)};
  // Wrong feature count.
  ASSERT_TRUE(mailbox_.Put(TensorKey{3, 0, 0, TensorKind::kInput}, math::Matrix::Zero(4, 5)).ok());
  absl::Status s = executor_->RunStep(3, actions, 4).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("step 3 position 0 F(mb=0, chunk=0)"));
  EXPECT_THAT(s.message(), HasSubstr("input(step=3, mb=0, chunk=0) has shape [4, 5], expected "
                                     "[4, 64]"));
  executor_->Abort();
  mailbox_.Reset();
  // Wrong row count.
  ASSERT_TRUE(mailbox_.Put(TensorKey{3, 0, 0, TensorKind::kInput}, math::Matrix::Zero(3, 64)).ok());
  s = executor_->RunStep(3, actions, 4).status();
  EXPECT_THAT(s.message(), HasSubstr("has shape [3, 64], expected [4, 64]"));
  executor_->Abort();
  mailbox_.Reset();
  // A label out of range.
  ASSERT_TRUE(mailbox_.Put(TensorKey{3, 0, 0, TensorKind::kInput}, math::Matrix::Zero(4, 64)).ok());
  ASSERT_TRUE(
      mailbox_.Put(TensorKey{3, 0, 0, TensorKind::kTarget}, math::Matrix::Constant(4, 1, 10.0f))
          .ok());
  s = executor_->RunStep(3, actions, 4).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("target(step=3, mb=0, chunk=0)"));
  executor_->Abort();
}

TEST_F(SingleWorkerTest, InputTimeoutNamesTheActionAndTheKey) {
  auto stage = model::Stage::Create(model_.get(), 0, model_->num_layers(), kSeed,
                                    Optimizer(math::OptimizerKind::kSgd));
  ASSERT_TRUE(stage.ok());
  std::vector<OwnedChunk> chunks;
  chunks.push_back(OwnedChunk{0, std::move(*stage)});
  auto e = StepExecutor::Create(model_.get(), std::move(chunks), 1, &mailbox_, &sender_,
                                ExecutorOptions{absl::Nanoseconds(1)});
  ASSERT_TRUE(e.ok());
  const absl::Status s =
      (*e)->RunStep(9, {A(Op::kForward, 0, 0), A(Op::kBackward, 0, 0)}, 4).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("position 0 F(mb=0, chunk=0)"));
  EXPECT_THAT(s.message(), HasSubstr("input(step=9, mb=0, chunk=0)"));
}

// ---------------------------------------------------------------------------------------------
// The tied embedding's gradient exchange, seen from the worker holding the embedding (chunk 0 of
// 2): its Sender plays the peer holding the head.

enum class TiePeer { kAnswers, kWrongShape, kLost };

class TiePeerSender : public Sender {
 public:
  TiePeerSender(Mailbox* mailbox, TiePeer peer) : mailbox_(mailbox), peer_(peer) {}
  void Send(const TensorKey& key, math::Matrix tensor) override {
    if (key.kind != TensorKind::kTiedGradient) return;  // chunk 1's activations.
    EXPECT_EQ(key, (TensorKey{key.step, 0, 1, TensorKind::kTiedGradient}));
    sent_ = std::move(tensor);
    const TensorKey reply{key.step, 0, 0, TensorKind::kTiedGradient};
    switch (peer_) {
      case TiePeer::kAnswers:
        EXPECT_TRUE(mailbox_->Put(reply, math::Matrix::Constant(11, 8, 0.5f)).ok());
        break;
      case TiePeer::kWrongShape:
        EXPECT_TRUE(mailbox_->Put(reply, math::Matrix::Constant(8, 11, 0.5f)).ok());
        break;
      case TiePeer::kLost:  // what a broken link does to the mailbox (WorkerJob::LinkFailed).
        mailbox_->Abort(absl::UnavailableError("link to stage/1 failed: connection refused"));
        break;
    }
  }
  const math::Matrix& sent() const { return sent_; }

 private:
  Mailbox* const mailbox_;
  const TiePeer peer_;
  math::Matrix sent_;
};

struct TieRun {
  absl::StatusOr<StepReport> report = absl::UnknownError("not run");
  std::vector<LayerNormSq> norms;  // after the step
  math::Matrix sent;
};

// Runs step 1 (F and B of one micro-batch of 2 samples) on chunk 0 (layers [0, 2)) of the 9-layer
// tied GPT, with `peer` answering the exchange.
TieRun RunEmbeddingWorker(const model::Model& model, TiePeer peer) {
  Mailbox mailbox;
  TiePeerSender sender(&mailbox, peer);
  std::vector<OwnedChunk> chunks;
  auto stage = model::Stage::Create(&model, 0, 2, kSeed, Optimizer(math::OptimizerKind::kSgd));
  EXPECT_TRUE(stage.ok());
  chunks.push_back(OwnedChunk{0, std::move(*stage)});
  auto e = StepExecutor::Create(&model, std::move(chunks), 2, &mailbox, &sender,
                                ExecutorOptions{absl::Seconds(30)});
  EXPECT_TRUE(e.ok()) << e.status();
  const io::Batch batch = model::testing::MakeBatch(model, 2, 1);
  EXPECT_TRUE(mailbox.Put(TensorKey{1, 0, 0, TensorKind::kInput}, batch.inputs).ok());
  math::Matrix dy(batch.inputs.rows(), 8);
  for (int64_t i = 0; i < dy.size(); ++i) dy.data()[i] = 0.01f * static_cast<float>(i % 7);
  EXPECT_TRUE(mailbox.Put(TensorKey{1, 0, 0, TensorKind::kGradient}, dy).ok());
  TieRun run;
  run.report = (*e)->RunStep(1, {{Op::kForward, 0, 0}, {Op::kBackward, 0, 0}}, batch.inputs.rows());
  if (run.report.ok()) run.norms = (*e)->GradNormSqPerLayer();
  run.sent = sender.sent();
  return run;
}

TEST(TiedExchangeTest, SendsItsPartAndKeepsTheSumWithTheEmbeddingsPartFirst) {
  auto model = model::testing::BuildOrDie(kTiedGptSpec);
  const TieRun run = RunEmbeddingWorker(*model, TiePeer::kAnswers);
  ASSERT_TRUE(run.report.ok()) << run.report.status();
  // The same F, I and W by hand: the part sent is the embedding's gradient, and the norm of
  // layer 0 is that of (part + the peer's 0.5) and the position table's gradient.
  auto stage = model::Stage::Create(model.get(), 0, 2, kSeed, Optimizer(math::OptimizerKind::kSgd));
  ASSERT_TRUE(stage.ok());
  const io::Batch batch = model::testing::MakeBatch(*model, 2, 1);
  model::MicrobatchState mb;
  stage->Forward(math::AsConstMap(batch.inputs), &mb);
  math::Matrix dy(batch.inputs.rows(), 8);
  for (int64_t i = 0; i < dy.size(); ++i) dy.data()[i] = 0.01f * static_cast<float>(i % 7);
  stage->BackwardInput(math::AsConstMap(dy), false, &mb);
  stage->BackwardWeight(&mb);
  absl::StatusOr<math::Tensor> part = stage->TiedGradPart(model::TieEnd::kEmbedding);
  ASSERT_TRUE(part.ok());
  ASSERT_EQ(run.sent.rows(), 11);
  ASSERT_EQ(run.sent.cols(), 8);
  EXPECT_EQ(std::memcmp(run.sent.data(), part->data.data(), part->data.size() * sizeof(float)), 0);
  math::Tensor peer{{11, 8}, std::vector<float>(88, 0.5f)};
  absl::StatusOr<math::Tensor> sum = model::SumTiedGradients(*part, peer);
  ASSERT_TRUE(sum.ok());
  absl::StatusOr<double> norm = stage->SetTiedGrad(model::TieEnd::kEmbedding, *sum);
  ASSERT_TRUE(norm.ok());
  ASSERT_FALSE(run.norms.empty());
  EXPECT_EQ(run.norms[0].layer, 0);
  EXPECT_EQ(Bits(run.norms[0].norm_sq), Bits(*norm));
  ASSERT_FALSE(run.report->layer_grad_norm_sq.empty());
  EXPECT_EQ(Bits(run.report->layer_grad_norm_sq[0].norm_sq), Bits(*norm)) << "reported norm";
}

TEST(TiedExchangeTest, APeerPartOfAnotherShapeIsInvalidArgument) {
  auto model = model::testing::BuildOrDie(kTiedGptSpec);
  const TieRun run = RunEmbeddingWorker(*model, TiePeer::kWrongShape);
  ASSERT_FALSE(run.report.ok());
  EXPECT_EQ(run.report.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(run.report.status().message(),
              HasSubstr("step 1: tied embedding: gradient exchange: the peer's part "
                        "tied_gradient(step=1, mb=0, chunk=0) has shape [8, 11], the local part "
                        "[11, 8]"));
}

TEST(TiedExchangeTest, ALostPeerFailsTheStepWithUnavailable) {
  auto model = model::testing::BuildOrDie(kTiedGptSpec);
  const TieRun run = RunEmbeddingWorker(*model, TiePeer::kLost);
  ASSERT_FALSE(run.report.ok());
  EXPECT_EQ(run.report.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(run.report.status().message(), HasSubstr("link to stage/1 failed"));
}

TEST(ExecutorCreateTest, RejectsInconsistentChunks) {
  auto model = model::testing::BuildOrDie(kDigitsMlpSpec);
  Mailbox mailbox;
  NoSender sender;
  const math::OptimizerConfig opt = Optimizer(math::OptimizerKind::kSgd);
  auto make = [&](std::vector<std::pair<int, std::pair<int64_t, int64_t>>> spec, int num_chunks) {
    std::vector<OwnedChunk> chunks;
    for (const auto& [c, range] : spec) {
      auto s = model::Stage::Create(model.get(), range.first, range.second, kSeed, opt);
      EXPECT_TRUE(s.ok());
      chunks.push_back(OwnedChunk{c, std::move(*s)});
    }
    return StepExecutor::Create(model.get(), std::move(chunks), num_chunks, &mailbox, &sender)
        .status();
  };
  const int64_t n = model->num_layers();
  EXPECT_THAT(make({}, 2).message(), HasSubstr("at least one chunk"));
  EXPECT_THAT(make({{0, {1, 5}}}, 2).message(), HasSubstr("chunk 0 starts at layer 1"));
  EXPECT_THAT(make({{1, {5, n - 1}}}, 2).message(), HasSubstr("last chunk 1 ends at layer"));
  EXPECT_THAT(make({{2, {0, 5}}}, 2).message(), HasSubstr("chunk 2 is outside [0, 2)"));
  EXPECT_THAT(make({{0, {0, 5}}, {1, {6, 8}}}, 4).message(), HasSubstr("not in layer order"));
  EXPECT_THAT(make({{0, {0, 5}}, {2, {5, 8}}}, 4).message(), HasSubstr("not in layer order"));
  EXPECT_THAT(make({{1, {3, 5}}, {1, {5, 8}}}, 4).message(), HasSubstr("given twice"));
  // Looped placement: chunks 0 and 2 of 4 with room for chunk 1 between them.
  EXPECT_TRUE(make({{2, {6, 8}}, {0, {0, 5}}}, 4).ok());
}

TEST(CombineLayerNormSqTest, SumsInLayerOrderAndChecksCoverage) {
  StepReport a, b;
  a.layer_grad_norm_sq = {{0, 1.0}, {1, 2.0}, {3, 8.0}};
  b.layer_grad_norm_sq = {{2, 4.0}};
  absl::StatusOr<double> sum = CombineLayerNormSq({&a, &b}, 4);
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(*sum, 15.0);
  EXPECT_THAT(CombineLayerNormSq({&a}, 4).status().message(), HasSubstr("no report has layer 2"));
  EXPECT_THAT(CombineLayerNormSq({&a, &b, &b}, 4).status().message(),
              HasSubstr("layer 2 is reported twice"));
  EXPECT_THAT(CombineLayerNormSq({&a, &b}, 3).status().message(),
              HasSubstr("layer 3 outside [0, 3)"));
}

}  // namespace
}  // namespace pipetrain::worker
