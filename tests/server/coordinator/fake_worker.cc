#include "tests/server/coordinator/fake_worker.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/math/optimizer.h"
#include "common/model/checkpoint.h"
#include "common/model/model.h"
#include "common/model/optimizer_proto.h"
#include "common/model/stage.h"
#include "common/util/status_macros.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/coordinator/shard_transfer.h"

namespace pipetrain::coordinator::testing {
namespace {

std::string KindOf(const v1::WorkerCommand& c) {
  switch (c.command_case()) {
    case v1::WorkerCommand::kAssign:
      return "assign";
    case v1::WorkerCommand::kOpenLinks:
      return "open_links";
    case v1::WorkerCommand::kRunStep:
      return "run_step";
    case v1::WorkerCommand::kCommit:
      return "commit";
    case v1::WorkerCommand::kAbort:
      return "abort";
    case v1::WorkerCommand::kSaveShards:
      return "save_shards";
    case v1::WorkerCommand::kRelease:
      return "release";
    case v1::WorkerCommand::kEvalRun:
      return "eval_run";
    case v1::WorkerCommand::kGenRun:
      return "gen_run";
    case v1::WorkerCommand::kProfileLayers:
      return "profile_layers";
    default:
      return "other";
  }
}

// The error event answering `fenced` (a RunStep, EvalRun, GenRun or SaveShards: its job,
// generation and step) with `status`.
template <typename Fenced>
v1::WorkerEvent ErrorEvent(const Fenced& fenced, const absl::Status& status) {
  v1::WorkerEvent event;
  v1::WorkerError* e = event.mutable_error();
  e->set_job(fenced.job());
  e->set_generation(fenced.generation());
  e->set_step(fenced.step());
  e->set_code(static_cast<int>(status.code()));
  e->set_message(std::string(status.message()));
  return event;
}

// The error event answering `run` (a RunStep, EvalRun or GenRun command) with `status`.
v1::WorkerEvent RunErrorEvent(const v1::WorkerCommand& run, const absl::Status& status) {
  switch (run.command_case()) {
    case v1::WorkerCommand::kRunStep:
      return ErrorEvent(run.run_step(), status);
    case v1::WorkerCommand::kEvalRun:
      return ErrorEvent(run.eval_run(), status);
    default:
      return ErrorEvent(run.gen_run(), status);
  }
}

// The run commands a held one is released from by an Abort, in the order an Abort looks for
// them, and what the error it is answered with calls it.
constexpr struct {
  v1::WorkerCommand::CommandCase kind;
  const char* what;
} kHeldRuns[] = {{v1::WorkerCommand::kGenRun, "decode round"},
                 {v1::WorkerCommand::kEvalRun, "evaluation"},
                 {v1::WorkerCommand::kRunStep, "step"}};

}  // namespace

absl::StatusOr<AssignedState> InitialStateOf(const v1::Assign& assign) {
  PT_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> net, model::Model::Build(assign.model()));
  PT_ASSIGN_OR_RETURN(math::OptimizerConfig optimizer,
                      model::OptimizerFromProto(assign.optimizer()));
  AssignedState state;
  for (const v1::ChunkSpec& c : assign.chunks()) {
    if (c.rank() != assign.rank()) continue;
    PT_ASSIGN_OR_RETURN(
        model::Stage stage,
        model::Stage::Create(net.get(), c.first_layer(), c.last_layer(), assign.seed(), optimizer));
    state.tensors.merge(stage.ExportState());
    for (const model::CheckpointShard& s :
         model::LayerShards(*net, c.first_layer(), c.last_layer())) {
      state.shards.push_back(s);
    }
  }
  return state;
}

FakeWorker::FakeWorker(CoordinatorCore* core, std::string name)
    : core_(core), name_(std::move(name)), thread_([this] { Loop(); }) {}

FakeWorker::~FakeWorker() {
  Gone();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

absl::Status FakeWorker::Register(double gflops, const std::vector<std::string>& isa_levels) {
  v1::WorkerEvent event;
  v1::RegisterWorker* r = event.mutable_register_();
  r->set_name(name_);
  r->set_address(absl::StrCat(name_, ":1"));
  r->set_cores(1);
  r->set_gflops(gflops);
  r->set_incarnation(1);
  for (const std::string& level : isa_levels) r->add_isa_levels(level);
  return core_->OnWorkerEvent(this, &registered_, event);
}

void FakeWorker::Gone() {
  {
    absl::MutexLock lock(&mu_);
    if (gone_) return;
    gone_ = true;
  }
  core_->OnWorkerGone(this, registered_);
}

void FakeWorker::Send(const v1::WorkerCommand& command) {
  absl::MutexLock lock(&mu_);
  if (closed_.has_value() || gone_) return;
  received_.push_back(KindOf(command));
  inbox_.push_back(command);
}

void FakeWorker::Close(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (!closed_.has_value()) closed_ = status;
}

void FakeWorker::HoldRunSteps() {
  absl::MutexLock lock(&mu_);
  hold_runs_ = true;
}

void FakeWorker::HoldAssigns() {
  absl::MutexLock lock(&mu_);
  hold_assigns_ = true;
}

void FakeWorker::DelayAssigns(absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  assign_delay_ = delay;
}

void FakeWorker::GateAssigns() {
  absl::MutexLock lock(&mu_);
  assign_gate_ = std::make_shared<absl::Notification>();
}

void FakeWorker::OpenAssigns() {
  absl::MutexLock lock(&mu_);
  if (assign_gate_ != nullptr && !assign_gate_->HasBeenNotified()) assign_gate_->Notify();
}

void FakeWorker::SkewGradNorms(double by) {
  absl::MutexLock lock(&mu_);
  grad_norm_skew_ = by;
}

void FakeWorker::FailRunSteps(absl::Status status) {
  absl::MutexLock lock(&mu_);
  fail_runs_ = std::move(status);
}

void FakeWorker::HoldProfiles() {
  absl::MutexLock lock(&mu_);
  hold_profiles_ = true;
}

void FakeWorker::FailProfiles(absl::Status status) {
  absl::MutexLock lock(&mu_);
  fail_profiles_ = std::move(status);
}

void FakeWorker::SlowProfiles(double factor) {
  absl::MutexLock lock(&mu_);
  profile_factor_ = factor;
}

v1::ProfileLayers FakeWorker::profile() const {
  absl::MutexLock lock(&mu_);
  return profile_;
}

std::vector<std::string> FakeWorker::Received() const {
  absl::MutexLock lock(&mu_);
  return received_;
}

bool FakeWorker::WaitFor(const std::string& kind, int count) const {
  auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::count(received_.begin(), received_.end(), kind) >= count;
  };
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
}

v1::Assign FakeWorker::assign() const {
  absl::MutexLock lock(&mu_);
  return assign_;
}

std::optional<absl::Status> FakeWorker::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

void FakeWorker::Loop() {
  for (;;) {
    v1::WorkerCommand command;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](FakeWorker* w)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) { return w->stop_ || !w->inbox_.empty(); },
          this));
      if (inbox_.empty()) return;  // stopped.
      command = std::move(inbox_.front());
      inbox_.pop_front();
    }
    std::optional<v1::WorkerEvent> event = Answer(command);
    // Off every lock of ours, as a reactor's reaction: the core may call Send meanwhile.
    if (event.has_value()) core_->OnWorkerEvent(this, &registered_, *event).IgnoreError();
  }
}

std::optional<v1::WorkerEvent> FakeWorker::Answer(const v1::WorkerCommand& command) {
  v1::WorkerEvent event;
  if (command.has_assign()) {
    const v1::Assign& a = command.assign();
    absl::Duration delay;
    std::shared_ptr<absl::Notification> gate;
    {
      absl::MutexLock lock(&mu_);
      assign_ = a;
      if (hold_assigns_) return std::nullopt;
      delay = assign_delay_;
      gate = assign_gate_;
    }
    if (gate != nullptr) gate->WaitForNotificationWithTimeout(absl::Seconds(30));
    absl::SleepFor(delay);  // the time a worker takes to build its stages.
    event.mutable_assigned()->set_job(a.job());
    event.mutable_assigned()->set_generation(a.generation());
    return event;
  }
  if (command.has_run_step() || command.has_eval_run() || command.has_gen_run()) {
    return AnswerRun(command);
  }
  if (command.has_profile_layers()) {
    absl::MutexLock lock(&mu_);
    profile_ = command.profile_layers();
    if (hold_profiles_) return std::nullopt;
    return Profiled(command.profile_layers());
  }
  if (command.has_commit()) {
    const v1::Commit& c = command.commit();
    event.mutable_committed()->set_job(c.job());
    event.mutable_committed()->set_generation(c.generation());
    event.mutable_committed()->set_step(c.step());
    return event;
  }
  if (command.has_abort()) {
    absl::MutexLock lock(&mu_);
    for (const auto& [kind, what] : kHeldRuns) {
      auto it = held_.find(kind);
      if (it == held_.end()) continue;
      v1::WorkerCommand run = std::move(it->second);
      held_.erase(it);
      return RunErrorEvent(run,
                           absl::AbortedError(absl::StrCat(what, " aborted by the coordinator")));
    }
    return std::nullopt;
  }
  if (command.has_save_shards()) {
    const v1::SaveShards& s = command.save_shards();
    if (const absl::Status uploaded = UploadShards(s); !uploaded.ok()) {
      return ErrorEvent(s, uploaded);
    }
    event.mutable_shards_saved()->set_job(s.job());
    event.mutable_shards_saved()->set_generation(s.generation());
    event.mutable_shards_saved()->set_step(s.step());
    return event;
  }
  return std::nullopt;
}

std::optional<v1::WorkerEvent> FakeWorker::AnswerRun(const v1::WorkerCommand& run) {
  absl::MutexLock lock(&mu_);
  if (run.has_gen_run()) gen_runs_.push_back(run.gen_run());
  if (hold_runs_) {
    held_[run.command_case()] = run;
    return std::nullopt;
  }
  if (!fail_runs_.ok()) return RunErrorEvent(run, fail_runs_);
  if (run.has_run_step()) return StepDone(run.run_step());
  if (run.has_eval_run()) return EvalDone(run.eval_run());
  return GenDone(run.gen_run());
}

v1::WorkerEvent FakeWorker::StepDone(const v1::RunStep& r) const {
  v1::WorkerEvent event;
  v1::StepDone* d = event.mutable_step_done();
  d->set_job(r.job());
  d->set_generation(r.generation());
  d->set_step(r.step());
  const int C = assign_.chunks_size();
  for (const v1::ChunkSpec& c : assign_.chunks()) {
    if (c.rank() != assign_.rank() || c.chunk() != C - 1) continue;
    // Losses that depend on the step and micro-batch, as real ones would: step N's are
    // 0.25 (mb + 1) + N - 1, mb the step's micro-batch (replica r's share starts at r M / R).
    const int first = assign_.replica() * assign_.microbatches();
    for (int mb = first; mb < first + assign_.microbatches(); ++mb) {
      d->add_microbatch_losses(0.25f * static_cast<float>(mb + 1) +
                               static_cast<float>(r.step() - 1));
    }
  }
  // A job that clips: every layer of its chunks, norm_sq layer + 1 (+ the scripted skew).
  if (assign_.optimizer().clip_norm() > 0) {
    for (const v1::ChunkSpec& c : assign_.chunks()) {
      if (c.rank() != assign_.rank()) continue;
      for (int64_t l = c.first_layer(); l < c.last_layer(); ++l) {
        v1::LayerNormSq* n = d->add_grad_norms();
        n->set_layer(l);
        n->set_norm_sq(static_cast<double>(l + 1) + grad_norm_skew_);
      }
    }
  }
  for (int p = 0; p < assign_.actions_size(); ++p) {
    v1::ActionTiming* t = d->add_timings();
    *t->mutable_action() = assign_.actions(p);
    t->set_start_us(10.0 * p);
    t->set_end_us(10.0 * p + 5);
  }
  return event;
}

v1::WorkerEvent FakeWorker::EvalDone(const v1::EvalRun& r) const {
  v1::WorkerEvent event;
  v1::EvalDone* d = event.mutable_eval_done();
  d->set_job(r.job());
  d->set_generation(r.generation());
  d->set_step(r.step());
  const int C = assign_.chunks_size();
  for (const v1::ChunkSpec& c : assign_.chunks()) {
    if (c.rank() != assign_.rank() || c.chunk() != C - 1) continue;
    // Micro-batch mb of R rows: a loss sum of 0.5 R (mb + 1) and mb correct rows.
    for (int mb = 0; mb < r.microbatch_rows_size(); ++mb) {
      d->add_loss_sums(0.5 * static_cast<double>(r.microbatch_rows(mb) * (mb + 1)));
      d->add_correct(mb);
    }
  }
  return event;
}

v1::WorkerEvent FakeWorker::GenDone(const v1::GenRun& r) const {
  v1::WorkerEvent event;
  v1::GenDone* d = event.mutable_gen_done();
  d->set_job(r.job());
  d->set_generation(r.generation());
  d->set_step(r.step());
  const int C = assign_.chunks_size();
  const int64_t vocab = assign_.model().layers(0).embedding().vocab_size();
  for (const v1::ChunkSpec& c : assign_.chunks()) {
    if (c.rank() != assign_.rank() || c.chunk() != C - 1) continue;
    // Run i's logits: 1 at FakeNextToken(run), 0 elsewhere (greedy picks that token).
    d->set_vocab(vocab);
    for (const v1::DecodeMicrobatch& run : r.runs()) {
      for (int64_t v = 0; v < vocab; ++v)
        d->add_logits(v == FakeNextToken(run, vocab) ? 1.0f : 0.0f);
    }
  }
  return event;
}

std::vector<v1::GenRun> FakeWorker::GenRuns() const {
  absl::MutexLock lock(&mu_);
  return gen_runs_;
}

v1::WorkerEvent FakeWorker::Profiled(const v1::ProfileLayers& p) const {
  v1::WorkerEvent event;
  v1::LayersProfiled* out = event.mutable_layers_profiled();
  out->set_profile(p.profile());
  out->set_code(static_cast<int32_t>(fail_profiles_.code()));
  out->set_message(std::string(fail_profiles_.message()));
  if (!fail_profiles_.ok()) return event;
  for (int64_t samples : p.samples()) {
    v1::SampleLayerCosts* costs = out->add_costs();
    costs->set_samples(samples);
    for (int l = 0; l < p.model().layers_size(); ++l) {
      v1::LayerSeconds* s = costs->add_layers();
      s->set_forward(profile_factor_ * 1e-3 * (l + 1) * samples);
      s->set_backward_input(2 * s->forward());
      s->set_backward_weight(2 * s->forward());
      s->set_optimizer(profile_factor_ * 1e-4 * (l + 1));
    }
  }
  out->set_cpu_seconds(0.5);
  return event;
}

absl::Status FakeWorker::UploadShards(const v1::SaveShards& save) const {
  v1::Assign a;
  {
    absl::MutexLock lock(&mu_);
    a = assign_;
  }
  PT_ASSIGN_OR_RETURN(AssignedState state, InitialStateOf(a));
  v1::PutStateRequest first;
  first.set_job(save.job());
  first.set_generation(save.generation());
  first.set_step(save.step());
  first.set_worker(registered_);
  PT_ASSIGN_OR_RETURN(UploadTarget target, core_->AcceptUpload(first));
  ShardUpload upload(std::move(target), nullptr);
  for (model::CheckpointShard& shard : state.shards) {
    PT_ASSIGN_OR_RETURN(std::string bytes,
                        model::SerializeCheckpointShard(&shard, state.tensors, save.step()));
    v1::StateChunk chunk;
    chunk.set_file(shard.file);
    chunk.set_first_layer(shard.first_layer);
    chunk.set_last_layer(shard.last_layer);
    chunk.set_sha256(shard.sha256);
    chunk.set_bytes(shard.bytes);
    chunk.set_data(std::move(bytes));
    PT_RETURN_IF_ERROR(upload.Write(chunk));
  }
  return upload.Finish();
}

// ---------------------------------------------------------------- feed links

class FakeFeedLinks::Link final : public FeedLink {
 public:
  Link(FakeFeedLinks* owner, int rank, std::function<void(const absl::Status&)> on_error)
      : owner_(owner), rank_(rank), on_error_(std::move(on_error)) {}

  absl::Status Send(const wire::TensorKey& key,
                    std::shared_ptr<const math::Matrix> tensor) override {
    absl::Status refused;
    {
      absl::MutexLock lock(&owner_->mu_);
      auto it = owner_->refused_.find(rank_);
      if (it == owner_->refused_.end()) {
        owner_->sent_[rank_].push_back(
            absl::StrCat(key.kind == wire::TensorKind::kInput ? "input" : "target", " step ",
                         key.step, " mb ", key.microbatch, " rows ", tensor->rows()));
        owner_->first_values_[rank_].push_back(tensor->size() > 0 ? tensor->data()[0] : 0.0f);
        return absl::OkStatus();
      }
      refused = it->second;
    }
    {
      absl::MutexLock lock(&mu_);
      if (!failed_.ok()) return failed_;
      failed_ = refused;
    }
    on_error_(refused);  // as a link reports its failure, then refuses what it is sent.
    return refused;
  }
  absl::Status status() const override {
    absl::MutexLock lock(&mu_);
    return failed_;
  }
  void Shutdown() override {}

 private:
  FakeFeedLinks* const owner_;
  const int rank_;
  const std::function<void(const absl::Status&)> on_error_;
  mutable absl::Mutex mu_;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<FeedLink>> FakeFeedLinks::Dial(
    const FeedTarget& target, std::function<void(const absl::Status&)> on_error) {
  absl::MutexLock lock(&mu_);
  ++dials_;
  return std::unique_ptr<FeedLink>(std::make_unique<Link>(this, target.rank, std::move(on_error)));
}

void FakeFeedLinks::Refuse(int rank, absl::Status status) {
  absl::MutexLock lock(&mu_);
  refused_[rank] = std::move(status);
}

std::vector<std::string> FakeFeedLinks::Sent(int rank) const {
  absl::MutexLock lock(&mu_);
  auto it = sent_.find(rank);
  return it == sent_.end() ? std::vector<std::string>() : it->second;
}

std::vector<float> FakeFeedLinks::FirstValues(int rank) const {
  absl::MutexLock lock(&mu_);
  auto it = first_values_.find(rank);
  return it == first_values_.end() ? std::vector<float>() : it->second;
}

int FakeFeedLinks::dials() const {
  absl::MutexLock lock(&mu_);
  return dials_;
}

}  // namespace pipetrain::coordinator::testing
