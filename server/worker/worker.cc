#include "server/worker/worker.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <unistd.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/math/det_math.h"
#include "common/math/optimizer.h"
#include "common/model/checkpoint.h"
#include "common/model/model.h"
#include "common/model/optimizer_proto.h"
#include "common/model/stage.h"
#include "common/wire/grpc_status.h"
#include "server/worker/executor.h"
#include "server/worker/mailbox.h"
#include "server/worker/proto_convert.h"

#ifdef PIPETRAIN_HAVE_GRPC_REFLECTION
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#endif

namespace pipetrain::worker {
namespace {

using wire::TensorKey;
using wire::TensorKind;

constexpr char kCoordinatorPeer[] = "coordinator";
constexpr char kStagePeerPrefix[] = "stage/";

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

int64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<int64_t>(pages) * static_cast<int64_t>(page_size);
}

// Splits "host:port" (host may be "[v6]"); false if there is no port.
bool SplitHostPort(const std::string& address, std::string* host, std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  int value = 0;
  return absl::SimpleAtoi(*port, &value) && value >= 0 && value <= 65535;
}

}  // namespace

absl::Status StageWorkerOptions::Check() const {
  std::string host, port;
  if (coordinator.empty() || !SplitHostPort(coordinator, &host, &port) || host.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinator must be host:port, got '", coordinator, "'"));
  }
  if (!SplitHostPort(listen, &host, &port)) {
    return absl::InvalidArgumentError(absl::StrCat("listen must be host:port, got '", listen, "'"));
  }
  if (!advertise.empty() && (!SplitHostPort(advertise, &host, &port) || host.empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat("advertise must be host:port, got '", advertise, "'"));
  }
  if (!(emulate_gflops >= 0) || emulate_gflops > 1e9) {
    return absl::InvalidArgumentError(
        absl::StrCat("emulate_gflops must be in [0, 1e9], got ", emulate_gflops));
  }
  if (threads_max < 0) {
    return absl::InvalidArgumentError(absl::StrCat("threads_max must be >= 0, got ", threads_max));
  }
  if (!(gflops >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("gflops must be >= 0, got ", gflops));
  }
  if (redial_initial <= absl::ZeroDuration() || redial_max < redial_initial) {
    return absl::InvalidArgumentError("redial backoff needs 0 < redial_initial <= redial_max");
  }
  return link.Check();
}

double MeasureGflops(absl::Duration duration) {
  constexpr int kN = 256;
  Eigen::MatrixXf a = Eigen::MatrixXf::Constant(kN, kN, 0.5f);
  Eigen::MatrixXf b = Eigen::MatrixXf::Constant(kN, kN, 0.25f);
  Eigen::MatrixXf c(kN, kN);
  // One compute thread: the rate per thread, whatever Eigen's (process-wide) setting is.
  const int threads = Eigen::nbThreads();
  Eigen::setNbThreads(1);
  const auto t0 = std::chrono::steady_clock::now();
  const auto until = t0 + absl::ToChronoNanoseconds(duration);
  int64_t products = 0;
  auto now = t0;
  do {
    c.noalias() = a * b;
    a(0, 0) = c(kN - 1, kN - 1) * 1e-9f;  // keep the products observable.
    ++products;
    now = std::chrono::steady_clock::now();
  } while (now < until);
  Eigen::setNbThreads(threads);
  const double seconds = std::chrono::duration<double>(now - t0).count();
  const double flops = 2.0 * kN * kN * kN * static_cast<double>(products);
  return std::max(1e-3, flops / std::max(seconds, 1e-9) / 1e9);
}

// ---------------------------------------------------------------------------------------------
// ControlStream: the client side of one Coordinator.Join stream. Shared by the session thread
// (which drops its reference after AwaitDone()) and Emit callers (which may still hold one; Write
// is a no-op once the stream closed). At most one read and one write in flight; events are queued
// by Write() from any thread. Reactions never block: a received command is handed to the daemon's
// command queue. gRPC calls are never made with a lock held (reactions may run inline).
class StageWorkerDaemon::ControlStream final
    : public grpc::ClientBidiReactor<v1::WorkerEvent, v1::WorkerCommand> {
 public:
  explicit ControlStream(StageWorkerDaemon* daemon) : daemon_(daemon) {}
  ControlStream(const ControlStream&) = delete;
  ControlStream& operator=(const ControlStream&) = delete;

  // Starts the call with `first` (RegisterWorker) as the first event. Events written before
  // Begin are queued behind it.
  void Begin(v1::Coordinator::Stub* stub, v1::WorkerEvent first) {
    context_.set_wait_for_ready(false);
    stub->async()->Join(&context_, this);
    AddHold();  // removed when the read side ends: Write() runs outside reactions.
    {
      absl::MutexLock lock(&mu_);
      current_ = std::move(first);  // writing_ is already true: Write() calls only queue.
    }
    StartWrite(&current_);
    StartRead(&read_buf_);
    StartCall();
  }

  // Queues `event`; dropped once the stream is closing. Thread-safe, non-blocking.
  void Write(v1::WorkerEvent event) {
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      if (writing_) {
        queue_.push_back(std::move(event));
        return;
      }
      writing_ = true;
      current_ = std::move(event);
      ++outside_ops_;
    }
    StartWrite(&current_);
    bool remove = false;
    {
      absl::MutexLock lock(&mu_);
      --outside_ops_;
      remove = ReleaseHoldLocked();
    }
    if (remove) RemoveHold();
  }

  // Cancels the call (thread-safe; the stream then ends with CANCELLED).
  void Cancel() { context_.TryCancel(); }

  // Blocks until OnDone and returns the call's status.
  absl::Status AwaitDone() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    return status_;
  }

  // Whether a command was received (the coordinator accepted us).
  bool got_command() {
    absl::MutexLock lock(&mu_);
    return got_command_;
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      if (!ok) closed_ = true;
      if (closed_ || queue_.empty()) {
        writing_ = false;
        queue_.clear();
        return;
      }
      current_ = std::move(queue_.front());
      queue_.pop_front();
    }
    StartWrite(&current_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      bool remove = false;
      {
        absl::MutexLock lock(&mu_);
        closed_ = true;
        read_ended_ = true;
        remove = ReleaseHoldLocked();
      }
      if (remove) RemoveHold();
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      got_command_ = true;
    }
    Task task;
    task.kind = Task::Kind::kCommand;
    task.command = std::move(read_buf_);
    read_buf_.Clear();
    daemon_->Enqueue(std::move(task));
    StartRead(&read_buf_);
  }

  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = wire::FromGrpcStatus(status, "control stream");
    if (status_.ok()) status_ = absl::UnavailableError("control stream: ended by the coordinator");
    done_ = true;
  }

 private:
  // True (once) when the hold can go: the read side ended and no outside write is starting.
  bool ReleaseHoldLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!read_ended_ || outside_ops_ > 0 || hold_released_) return false;
    hold_released_ = true;
    return true;
  }

  StageWorkerDaemon* const daemon_;
  grpc::ClientContext context_;
  v1::WorkerCommand read_buf_;  // owned by the read chain.

  // Protects the write queue, the stream's flags and its final status.
  absl::Mutex mu_;
  v1::WorkerEvent current_;  // the event being written; owned by the write chain while writing_.
  std::deque<v1::WorkerEvent> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = true;  // the first event, from Begin.
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool read_ended_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_released_ ABSL_GUARDED_BY(mu_) = false;
  int outside_ops_ ABSL_GUARDED_BY(mu_) = 0;
  bool got_command_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------------------------
// ComputePacer: --emulate-gflops. Keeps a virtual clock of the compute thread in which every
// action takes exactly FLOPs / rate and starts when both the previous action has ended and its
// inputs have arrived (in-order execution, as the simulator models it). The real math still runs;
// the compute thread is held back where the pipeline can observe it:
//  * before each Send (the output of F on a non-last chunk, of I/B on a chunk > 0) it sleeps until
//    the virtual end of the producing action;
//  * after RunStep it sleeps until the virtual end of the last action, before StepDone.
// Input arrival times come from the mailbox (MailboxObserver: the end of a blocked Take); an
// input already present when taken arrived before the virtual clock needs it (the real thread
// never runs behind the virtual one at a Take), so it does not delay the action.
// Actions without a Send (W, F of the last chunk, I/B of chunk 0) are not slept on themselves:
// their time is paid at the next Send or at the end of the step, so the reported per-action
// timings attribute it to that later action; step time and every tensor's send time follow the
// virtual clock. Thread-safe: the observer calls come from any thread; the rest from the compute
// thread.
class ComputePacer final : public MailboxObserver {
 public:
  using Clock = std::chrono::steady_clock;

  explicit ComputePacer(double gflops) : flops_per_second_(gflops * 1e9) {}

  // Before the compute thread starts: the worker's actions, the model and each chunk's layers.
  void Configure(const model::Model* model, std::vector<schedule::Action> actions,
                 std::vector<std::pair<int64_t, int64_t>> chunk_layers, int num_chunks) {
    model_ = model;
    actions_ = std::move(actions);
    chunk_layers_ = std::move(chunk_layers);
    num_chunks_ = num_chunks;
    for (size_t i = 0; i < actions_.size(); ++i) {
      const schedule::Action& a = actions_[i];
      const int index = static_cast<int>(i);
      if (a.op == schedule::Op::kForward) {
        take_index_[Slot(a.mb, a.chunk, TensorKind::kActivation)] = index;
        take_index_[Slot(a.mb, a.chunk, TensorKind::kInput)] = index;
        take_index_[Slot(a.mb, a.chunk, TensorKind::kTarget)] = index;
        send_index_[Slot(a.mb, a.chunk + 1, TensorKind::kActivation)] = index;
      } else if (a.op == schedule::Op::kInputGrad || a.op == schedule::Op::kBackward) {
        take_index_[Slot(a.mb, a.chunk, TensorKind::kGradient)] = index;
        send_index_[Slot(a.mb, a.chunk - 1, TensorKind::kGradient)] = index;
      }
    }
  }

  // Compute thread, right before StepExecutor::RunStep.
  void BeginStep(int64_t step, int64_t batch_rows) {
    const int64_t mb_rows = batch_rows / std::max(1, Microbatches());
    if (mb_rows != seconds_rows_) {
      seconds_.assign(actions_.size(), 0.0);
      for (size_t i = 0; i < actions_.size(); ++i) seconds_[i] = ActionFlops(i, mb_rows);
      for (double& sec : seconds_) sec /= flops_per_second_;
      seconds_rows_ = mb_rows;
    }
    absl::MutexLock lock(&mu_);
    step_ = step;
    ready_.assign(actions_.size(), Clock::time_point::min());
    starts_.assign(actions_.size(), Clock::time_point::min());
    readies_.assign(actions_.size(), Clock::time_point::min());
    ends_.assign(actions_.size(), Clock::time_point::min());
    next_ = 0;
    clock_ = Clock::now();
    base_ = clock_;
  }

  // Compute thread, from the Sender: waits until the virtual end of the action sending `key`.
  void BeforeSend(const TensorKey& key) {
    auto it = send_index_.find(Slot(key.microbatch, key.chunk, key.kind));
    if (it == send_index_.end()) return;
    absl::MutexLock lock(&mu_);
    if (key.step != step_) return;
    const Clock::time_point until = AdvanceLocked(it->second);
    const Clock::time_point now = Clock::now();
    // Real compute slower than the rate: the real time wins. (The sleep's own wake-up latency
    // is not charged to the virtual clock.)
    if (now > until && it->second == next_ - 1) {
      clock_ = now;
      ends_[it->second] = now;
    }
    SleepUntilLocked(until);
  }

  // Compute thread, after a successful RunStep: waits until the virtual end of the last action.
  void EndStep() {
    absl::MutexLock lock(&mu_);
    if (actions_.empty()) return;
    SleepUntilLocked(AdvanceLocked(static_cast<int>(actions_.size()) - 1));
  }

  // After EndStep: replaces the executor's timings of `report` (one per action, in order) by the
  // virtual ones, relative to BeginStep, so the reported timeline is the emulated one.
  void RewriteTimings(StepReport* report) {
    absl::MutexLock lock(&mu_);
    if (report->timings.size() != actions_.size() || next_ != static_cast<int>(actions_.size())) {
      return;
    }
    report->wait_time = report->compute_time = absl::ZeroDuration();
    for (size_t i = 0; i < actions_.size(); ++i) {
      ActionTiming& t = report->timings[i];
      t.start = absl::FromChrono(starts_[i] - base_);
      t.ready = absl::FromChrono(readies_[i] - base_);
      t.end = absl::FromChrono(ends_[i] - base_);
      report->wait_time += t.wait();
      report->compute_time += t.compute();
    }
  }

  // Ends every current and future sleep at once (the job is stopping). Any thread.
  void Cancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }

  void OnWaitStart(const TensorKey& key) override {}
  void OnWaitEnd(const TensorKey& key) override {
    auto it = take_index_.find(Slot(key.microbatch, key.chunk, key.kind));
    if (it == take_index_.end()) return;
    const Clock::time_point now = Clock::now();
    absl::MutexLock lock(&mu_);
    if (key.step != step_ || ready_.empty()) return;
    ready_[it->second] = std::max(ready_[it->second], now);
  }

 private:
  int64_t Slot(int mb, int chunk, TensorKind kind) const {
    return (static_cast<int64_t>(mb) * (num_chunks_ + 2) + (chunk + 1)) * 8 +
           static_cast<int64_t>(kind);
  }
  int Microbatches() const {
    int m = 0;
    for (const schedule::Action& a : actions_) m = std::max(m, a.mb + 1);
    return m;
  }
  double ActionFlops(size_t i, int64_t rows) const {
    const schedule::Action& a = actions_[i];
    const auto [first, last] = chunk_layers_[a.chunk];
    double flops = 0;
    for (int64_t l = first; l < last; ++l) {
      const math::FlopCount f = model_->layer(l).Flops(rows);
      switch (a.op) {
        case schedule::Op::kForward:
          flops += f.forward;
          break;
        case schedule::Op::kBackward:
          flops += f.backward_input + f.backward_weight;
          break;
        case schedule::Op::kInputGrad:
          flops += f.backward_input;
          break;
        case schedule::Op::kWeightGrad:
          flops += f.backward_weight;
          break;
      }
    }
    return flops;
  }
  // Waits (releasing mu_) until `until` or Cancel().
  void SleepUntilLocked(Clock::time_point until) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Clock::duration left = until - Clock::now();
    if (left <= Clock::duration::zero() || cancelled_) return;
    mu_.AwaitWithTimeout(absl::Condition(&cancelled_), absl::FromChrono(left));
  }

  // Runs the virtual clock through action `k` and returns its virtual end.
  Clock::time_point AdvanceLocked(int k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (; next_ <= k; ++next_) {
      starts_[next_] = clock_;
      const Clock::time_point ready = std::max(clock_, ready_[next_]);
      readies_[next_] = ready;
      clock_ = ready + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(seconds_[next_]));
      ends_[next_] = clock_;
    }
    return ends_[k];
  }

  // Constant after Configure (before the compute thread starts).
  const double flops_per_second_;
  const model::Model* model_ = nullptr;
  std::vector<schedule::Action> actions_;
  std::vector<std::pair<int64_t, int64_t>> chunk_layers_;  // [chunk] -> [first, last) layers.
  int num_chunks_ = 0;
  absl::flat_hash_map<int64_t, int> take_index_;  // (mb, chunk, kind) taken -> action index.
  absl::flat_hash_map<int64_t, int> send_index_;  // (mb, chunk, kind) sent -> action index.

  // Compute thread only.
  std::vector<double> seconds_;  // per action, for micro-batches of seconds_rows_ rows.
  int64_t seconds_rows_ = -1;

  // Protects the step's virtual clock, input arrival times and the cancel flag; the compute
  // thread sleeps on it (AwaitWithTimeout), so observer calls are never held up by a sleep.
  absl::Mutex mu_;
  int64_t step_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<Clock::time_point> ready_ ABSL_GUARDED_BY(mu_);    // latest input arrival.
  std::vector<Clock::time_point> starts_ ABSL_GUARDED_BY(mu_);   // virtual starts so far.
  std::vector<Clock::time_point> readies_ ABSL_GUARDED_BY(mu_);  // virtual input readiness.
  std::vector<Clock::time_point> ends_ ABSL_GUARDED_BY(mu_);     // virtual ends so far.
  Clock::time_point base_ ABSL_GUARDED_BY(mu_);                  // BeginStep's time.
  int next_ ABSL_GUARDED_BY(mu_) = 0;             // first action not yet on the virtual clock.
  Clock::time_point clock_ ABSL_GUARDED_BY(mu_);  // virtual end of the last advanced action.
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// ---------------------------------------------------------------------------------------------
// Job: one (job, epoch) assignment. Created and driven by the command thread (Create, OnRunStep,
// OnCommit, OnAbort, OnSaveShards, OnLinkFailed, Stop); Accept runs on gRPC threads; the
// executor, Send (the Sender) and the posted tasks run on the job's compute thread.
class StageWorkerDaemon::Job final : public Sender {
 public:
  static absl::StatusOr<std::shared_ptr<Job>> Create(const v1::Assign& assign,
                                                     StageWorkerDaemon* daemon);
  ~Job() override { Stop("job dropped"); }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const std::string& id() const { return job_; }
  int64_t epoch() const { return epoch_; }

  // Aborts the running step, joins the compute thread and closes every link. Idempotent; not
  // from a gRPC callback or the compute thread.
  void Stop(absl::string_view why) {
    if (pacer_ != nullptr) pacer_->Cancel();
    mailbox_.Abort(absl::AbortedError(absl::StrCat("job ", job_, " epoch ", epoch_, ": ", why)));
    {
      absl::MutexLock lock(&compute_mu_);
      compute_stop_ = true;
      compute_queue_.clear();
    }
    if (compute_thread_.joinable()) compute_thread_.join();
    std::vector<std::unique_ptr<PeerLink>> links;
    {
      absl::MutexLock lock(&links_mu_);
      closed_ = true;
      for (auto& [rank, slot] : peers_) {
        if (slot.link != nullptr) links.push_back(std::move(slot.link));
        slot.pending.clear();
      }
      for (auto& link : coordinator_links_) links.push_back(std::move(link));
      coordinator_links_.clear();
    }
    for (auto& link : links) link->Shutdown();
  }

  absl::StatusOr<LinkSettings> Accept(const PeerHello& hello, std::unique_ptr<PeerLink> link);

  void OnRunStep(const v1::RunStep& run);
  void OnCommit(const v1::Commit& commit);
  void OnAbort(const v1::Abort& abort);
  void OnSaveShards(const v1::SaveShards& save);
  // A link of this job failed (LinkFailed, via the command queue). `coordinator_link`: the
  // coordinator's feed stream, which does not break the epoch.
  void OnLinkFailed(const absl::Status& status, bool coordinator_link);

  // Sender: routes an outgoing tensor to this worker's mailbox or the owner's link (compute
  // thread). Never blocks on the network; a failure aborts the mailbox (so the step fails).
  void Send(const TensorKey& key, math::Matrix tensor) override;

 private:
  struct PeerSlot {
    std::unique_ptr<PeerLink> link;  // null until dialled or accepted.
    std::vector<std::pair<TensorKey, std::shared_ptr<const math::Matrix>>> pending;
  };

  Job(StageWorkerDaemon* daemon, const v1::Assign& assign)
      : daemon_(daemon),
        assign_(assign),
        pacer_(daemon->options_.emulate_gflops > 0
                   ? std::make_unique<ComputePacer>(daemon->options_.emulate_gflops)
                   : nullptr),
        mailbox_(MailboxOptions{0, pacer_.get()}) {
    job_ = assign.job();
    epoch_ = assign.epoch();
    rank_ = assign.rank();
  }

  // Runs `task` on the compute thread after the tasks posted before it.
  void Post(std::function<void()> task) {
    absl::MutexLock lock(&compute_mu_);
    if (compute_stop_) return;
    compute_queue_.push_back(std::move(task));
  }
  void ComputeLoop() {
    for (;;) {
      std::function<void()> task;
      {
        absl::MutexLock lock(&compute_mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(compute_mu_) {
          return compute_stop_ || !compute_queue_.empty();
        };
        compute_mu_.Await(absl::Condition(&ready));
        if (compute_stop_) return;
        task = std::move(compute_queue_.front());
        compute_queue_.pop_front();
      }
      task();
    }
  }

  // Receive settings for a stream carrying `kinds` from `peer_rank` (-1: the coordinator).
  LinkSettings SettingsFor(uint32_t kinds, int peer_rank);
  // Validates the ownership of a received key and puts it into the mailbox.
  absl::Status Deliver(int peer_rank, const TensorKey& key, math::Matrix tensor);
  void LinkFailed(const std::string& peer, const absl::Status& status);
  void DialPeers();
  void Emit(v1::WorkerEvent event) { daemon_->Emit(std::move(event)); }
  void EmitError(int64_t step, const absl::Status& status) {
    daemon_->EmitError(job_, epoch_, step, status);
  }

  // Constant after Create.
  StageWorkerDaemon* const daemon_;
  const v1::Assign assign_;
  std::string job_;
  int64_t epoch_ = 0;
  int rank_ = 0;
  int num_chunks_ = 0;
  int microbatches_ = 0;
  std::vector<int> owner_;  // [chunk] -> rank.
  std::vector<int> higher_peers_, lower_peers_;
  std::vector<schedule::Action> actions_;
  std::unique_ptr<model::Model> model_;
  std::vector<model::CheckpointShard> shards_;  // this worker's layer files.

  // --emulate-gflops (null when off); before the mailbox, which reports waits to it.
  const std::unique_ptr<ComputePacer> pacer_;
  Mailbox mailbox_;                         // thread-safe.
  std::unique_ptr<StepExecutor> executor_;  // compute thread only (after Create).

  // Command thread only.
  bool dialled_ = false;
  int64_t requested_step_ = -1;  // latest RunStep received.
  int64_t requested_runs_ = 0;   // RunSteps received.

  // Compute thread only.
  bool step_ok_ = false;  // the last RunStep succeeded and awaits Commit or Abort.
  int64_t ran_step_ = -1;

  // Protects the compute thread's queue and stop flag.
  absl::Mutex compute_mu_;
  std::deque<std::function<void()>> compute_queue_ ABSL_GUARDED_BY(compute_mu_);
  bool compute_stop_ ABSL_GUARDED_BY(compute_mu_) = false;
  std::thread compute_thread_;

  // Protects the links, tensors waiting for a link, and the link-failure state.
  absl::Mutex links_mu_;
  std::map<int, PeerSlot> peers_ ABSL_GUARDED_BY(links_mu_);
  std::vector<std::unique_ptr<PeerLink>> coordinator_links_ ABSL_GUARDED_BY(links_mu_);
  absl::Status broken_ ABSL_GUARDED_BY(links_mu_);  // first link failure of this epoch.
  bool closed_ ABSL_GUARDED_BY(links_mu_) = false;

  // Protects the step flags read by the command thread when a link fails.
  absl::Mutex state_mu_;
  int64_t finished_runs_ ABSL_GUARDED_BY(state_mu_) = 0;  // RunSteps the compute thread ended.
  int64_t aborted_run_ ABSL_GUARDED_BY(state_mu_) = 0;    // run (1-based) the coordinator aborted.
  bool last_step_failed_ ABSL_GUARDED_BY(state_mu_) = false;
};

absl::StatusOr<std::shared_ptr<StageWorkerDaemon::Job>> StageWorkerDaemon::Job::Create(
    const v1::Assign& a, StageWorkerDaemon* daemon) {
  auto bad = [&a](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("Assign(job ", a.job(), ", epoch ", a.epoch(), "): ", what));
  };
  if (a.job().empty()) return bad("empty job id");
  if (a.epoch() < 0) return bad(absl::StrCat("epoch ", a.epoch(), " < 0"));
  if (a.stages() < 1 || a.virtual_stages() < 1 || a.microbatches() < 1) {
    return bad(absl::StrCat("stages (", a.stages(), "), virtual_stages (", a.virtual_stages(),
                            ") and microbatches (", a.microbatches(), ") must be >= 1"));
  }
  if (static_cast<int64_t>(a.stages()) * a.virtual_stages() > (int64_t{1} << 20)) {
    return bad("stages * virtual_stages is too large");
  }
  if (a.rank() < 0 || a.rank() >= a.stages()) {
    return bad(absl::StrCat("rank ", a.rank(), " is outside [0, ", a.stages(), ")"));
  }
  const int threads_max = daemon->options_.threads_max > 0
                              ? daemon->options_.threads_max
                              : std::max(1u, std::thread::hardware_concurrency());
  if (a.threads() < 1 || a.threads() > threads_max) {
    return bad(absl::StrCat("threads ", a.threads(), " is outside [1, ", threads_max, "]"));
  }
  if (a.worker_addresses_size() != a.stages()) {
    return bad(
        absl::StrCat(a.worker_addresses_size(), " worker addresses for ", a.stages(), " stages"));
  }
  const int num_chunks = a.stages() * a.virtual_stages();
  if (a.chunks_size() != num_chunks) {
    return bad(
        absl::StrCat(a.chunks_size(), " chunks, expected stages * virtual_stages = ", num_chunks));
  }
  absl::StatusOr<std::unique_ptr<model::Model>> model = model::Model::Build(a.model());
  if (!model.ok()) return bad(absl::StrCat("model: ", model.status().message()));
  const int64_t layers = (*model)->num_layers();
  std::vector<int> owner(num_chunks);
  for (int c = 0; c < num_chunks; ++c) {
    const v1::ChunkSpec& spec = a.chunks(c);
    const int64_t expected_first = c == 0 ? 0 : a.chunks(c - 1).last_layer();
    if (spec.chunk() != c) {
      return bad(absl::StrCat("chunks[", c, "] has chunk index ", spec.chunk()));
    }
    if (spec.worker() < 0 || spec.worker() >= a.stages()) {
      return bad(absl::StrCat("chunk ", c, " is on worker ", spec.worker(), " outside [0, ",
                              a.stages(), ")"));
    }
    if (spec.first_layer() != expected_first || spec.last_layer() <= spec.first_layer() ||
        spec.last_layer() > layers || (c == num_chunks - 1 && spec.last_layer() != layers)) {
      return bad(absl::StrCat("chunk ", c, " has layers [", spec.first_layer(), ", ",
                              spec.last_layer(), "); chunks must tile [0, ", layers,
                              ") in order, each non-empty"));
    }
    if (a.worker_addresses(spec.worker()).empty()) {
      return bad(absl::StrCat("worker ", spec.worker(), " has no address"));
    }
    owner[c] = spec.worker();
  }
  absl::StatusOr<std::vector<schedule::Action>> actions = ActionsFromProto(a.actions());
  if (!actions.ok()) return bad(actions.status().message());
  if (actions->empty()) return bad("no actions");
  for (size_t i = 0; i < actions->size(); ++i) {
    const schedule::Action& act = (*actions)[i];
    if (act.chunk >= num_chunks || owner[act.chunk] != a.rank()) {
      return bad(absl::StrCat("action ", i, " ", schedule::ActionToString(act),
                              " is on a chunk this worker (rank ", a.rank(), ") does not hold"));
    }
    if (act.mb >= a.microbatches()) {
      return bad(absl::StrCat("action ", i, " ", schedule::ActionToString(act),
                              " has a micro-batch outside [0, ", a.microbatches(), ")"));
    }
  }
  absl::StatusOr<math::OptimizerConfig> optimizer = model::OptimizerFromProto(a.optimizer());
  if (!optimizer.ok()) return bad(absl::StrCat("optimizer: ", optimizer.status().message()));

  std::shared_ptr<Job> job(new Job(daemon, a));
  job->num_chunks_ = num_chunks;
  job->microbatches_ = a.microbatches();
  job->owner_ = owner;
  job->actions_ = *std::move(actions);
  job->model_ = *std::move(model);
  std::vector<OwnedChunk> chunks;
  for (int c = 0; c < num_chunks; ++c) {
    if (owner[c] != a.rank()) continue;
    const v1::ChunkSpec& spec = a.chunks(c);
    absl::StatusOr<model::Stage> stage = model::Stage::Create(
        job->model_.get(), spec.first_layer(), spec.last_layer(), a.seed(), *optimizer);
    if (!stage.ok()) return bad(absl::StrCat("chunk ", c, ": ", stage.status().message()));
    chunks.push_back(OwnedChunk{c, *std::move(stage)});
    for (const model::CheckpointShard& shard :
         model::LayerShards(*job->model_, spec.first_layer(), spec.last_layer())) {
      job->shards_.push_back(shard);
    }
    for (int n : {c - 1, c + 1}) {
      if (n < 0 || n >= num_chunks || owner[n] == a.rank()) continue;
      std::vector<int>& peers = owner[n] > a.rank() ? job->higher_peers_ : job->lower_peers_;
      if (std::find(peers.begin(), peers.end(), owner[n]) == peers.end()) {
        peers.push_back(owner[n]);
      }
    }
  }
  if (chunks.empty()) return bad(absl::StrCat("rank ", a.rank(), " holds no chunk"));
  absl::StatusOr<std::unique_ptr<StepExecutor>> executor = StepExecutor::Create(
      job->model_.get(), std::move(chunks), num_chunks, &job->mailbox_, job.get());
  if (!executor.ok()) return bad(executor.status().message());
  job->executor_ = *std::move(executor);
  if (job->pacer_ != nullptr) {
    std::vector<std::pair<int64_t, int64_t>> chunk_layers;
    for (int c = 0; c < num_chunks; ++c) {
      chunk_layers.emplace_back(a.chunks(c).first_layer(), a.chunks(c).last_layer());
    }
    job->pacer_->Configure(job->model_.get(), job->actions_, std::move(chunk_layers), num_chunks);
  }
  {
    absl::MutexLock lock(&job->links_mu_);
    for (int p : job->higher_peers_) job->peers_[p];
    for (int p : job->lower_peers_) job->peers_[p];
  }
  Eigen::setNbThreads(a.threads());
  job->compute_thread_ = std::thread([raw = job.get()] { raw->ComputeLoop(); });
  return job;
}

LinkSettings StageWorkerDaemon::Job::SettingsFor(uint32_t kinds, int peer_rank) {
  LinkSettings settings;
  settings.validation.expected = wire::StreamIdentity{job_, epoch_};
  settings.validation.num_microbatches = microbatches_;
  settings.validation.num_chunks = num_chunks_;
  settings.validation.allowed_kinds = kinds;
  const std::string peer =
      peer_rank < 0 ? std::string(kCoordinatorPeer) : absl::StrCat(kStagePeerPrefix, peer_rank);
  settings.callbacks.on_tensor = [this, peer_rank](const TensorKey& key, math::Matrix tensor) {
    return Deliver(peer_rank, key, std::move(tensor));
  };
  settings.callbacks.on_error = [this, peer](const absl::Status& status) {
    LinkFailed(peer, status);
  };
  return settings;
}

absl::Status StageWorkerDaemon::Job::Deliver(int peer_rank, const TensorKey& key,
                                             math::Matrix tensor) {
  // The frame decoder checked job, epoch, ranges and kinds; here: does the tensor belong here,
  // from this peer?
  bool ok = key.chunk >= 0 && key.chunk < num_chunks_ && owner_[key.chunk] == rank_;
  if (ok && peer_rank >= 0) {
    const int from = key.kind == TensorKind::kActivation ? key.chunk - 1 : key.chunk + 1;
    ok = (key.kind == TensorKind::kActivation || key.kind == TensorKind::kGradient) && from >= 0 &&
         from < num_chunks_ && owner_[from] == peer_rank;
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank_, " received ", key.ToString(), " from ",
        peer_rank < 0 ? std::string(kCoordinatorPeer) : absl::StrCat(kStagePeerPrefix, peer_rank),
        ", which is not routed to it by the chunk placement"));
  }
  absl::Status put = mailbox_.Put(key, std::move(tensor));
  // While the mailbox is aborted (a failed or aborted step) late tensors are dropped quietly.
  if (!put.ok() && !mailbox_.status().ok()) return absl::OkStatus();
  // A second input or target for one key means stale data of an aborted run is in the mailbox:
  // fail the step rather than compute with it.
  if (!put.ok() && peer_rank < 0) mailbox_.Abort(put);
  return put;
}

void StageWorkerDaemon::Job::LinkFailed(const std::string& peer, const absl::Status& status) {
  const absl::Status annotated =
      wire::Annotate(status, absl::StrCat("job ", job_, " epoch ", epoch_, ": link to ", peer));
  // A stage link is part of the epoch: once it failed, the epoch cannot run a step any more. The
  // coordinator's feed stream is replaceable (it redials it in the same epoch) and its failure
  // is the coordinator's to handle (it aborts the step it was feeding).
  const bool coordinator = peer == kCoordinatorPeer;
  {
    absl::MutexLock lock(&links_mu_);
    if (closed_) return;
    if (!coordinator && broken_.ok()) broken_ = annotated;
  }
  if (!coordinator) mailbox_.Abort(annotated);
  Task task;
  task.kind = Task::Kind::kLinkFailed;
  task.job = job_;
  task.epoch = epoch_;
  task.status = annotated;
  task.coordinator_link = coordinator;
  daemon_->Enqueue(std::move(task));
}

absl::StatusOr<LinkSettings> StageWorkerDaemon::Job::Accept(const PeerHello& hello,
                                                            std::unique_ptr<PeerLink> link) {
  if (hello.identity.job != job_) {
    // Links are dialled only after every worker answered Assigned: a stream for another job
    // means this worker lost that job (restarted or re-assigned), hence ABORTED.
    return absl::AbortedError(absl::StrCat("worker rank ", rank_, " runs job '", job_, "', not '",
                                           hello.identity.job, "'"));
  }
  if (hello.identity.epoch != epoch_) {
    return absl::AbortedError(absl::StrCat("job ", job_, " is at epoch ", epoch_,
                                           "; stream for epoch ", hello.identity.epoch, " from '",
                                           hello.peer, "' is stale"));
  }
  if (hello.peer == kCoordinatorPeer) {
    uint32_t kinds = 0;
    if (owner_[0] == rank_) kinds |= wire::KindBit(TensorKind::kInput);
    if (owner_[num_chunks_ - 1] == rank_) kinds |= wire::KindBit(TensorKind::kTarget);
    if (kinds == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank_, " holds neither the first nor the last chunk: no coordinator stream"));
    }
    LinkSettings settings = SettingsFor(kinds, -1);
    absl::MutexLock lock(&links_mu_);
    if (closed_) return absl::AbortedError(absl::StrCat("job ", job_, " is shutting down"));
    coordinator_links_.push_back(std::move(link));
    return settings;
  }
  int peer_rank = -1;
  absl::string_view name = hello.peer;
  if (!absl::ConsumePrefix(&name, kStagePeerPrefix) || !absl::SimpleAtoi(name, &peer_rank) ||
      std::find(lower_peers_.begin(), lower_peers_.end(), peer_rank) == lower_peers_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_,
                     " accepts Exchange streams only from 'coordinator' and lower-rank "
                     "neighbours, not from '",
                     hello.peer, "'"));
  }
  LinkSettings settings = SettingsFor(
      wire::KindBit(TensorKind::kActivation) | wire::KindBit(TensorKind::kGradient), peer_rank);
  std::vector<std::pair<TensorKey, std::shared_ptr<const math::Matrix>>> pending;
  PeerLink* raw = link.get();
  {
    absl::MutexLock lock(&links_mu_);
    if (closed_) return absl::AbortedError(absl::StrCat("job ", job_, " is shutting down"));
    PeerSlot& slot = peers_[peer_rank];
    if (slot.link != nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", rank_, " already has a stream from '", hello.peer, "'"));
    }
    slot.link = std::move(link);
    pending.swap(slot.pending);
  }
  // Tensors the compute thread produced before the stream arrived (queued, not yet written:
  // the link starts writing once it is configured and the peer granted credit).
  for (auto& [key, tensor] : pending) {
    if (absl::Status s = raw->Send(key, std::move(tensor)); !s.ok()) mailbox_.Abort(s);
  }
  return settings;
}

void StageWorkerDaemon::Job::DialPeers() {
  for (int p : higher_peers_) {
    const std::string& address = assign_.worker_addresses(p);
    LinkSettings settings = SettingsFor(
        wire::KindBit(TensorKind::kActivation) | wire::KindBit(TensorKind::kGradient), p);
    absl::StatusOr<std::unique_ptr<PeerLink>> link = PeerLink::Connect(
        CreateExchangeChannel(address), absl::StrCat(kStagePeerPrefix, p, " (", address, ")"),
        PeerHello{absl::StrCat(kStagePeerPrefix, rank_), wire::StreamIdentity{job_, epoch_}},
        daemon_->options_.link, std::move(settings));
    if (!link.ok()) {
      LinkFailed(absl::StrCat(kStagePeerPrefix, p), link.status());
      continue;
    }
    absl::MutexLock lock(&links_mu_);
    if (closed_) return;
    peers_[p].link = *std::move(link);
  }
}

void StageWorkerDaemon::Job::Send(const TensorKey& key, math::Matrix tensor) {
  if (pacer_ != nullptr) pacer_->BeforeSend(key);
  const int owner = key.chunk >= 0 && key.chunk < num_chunks_ ? owner_[key.chunk] : -1;
  if (owner == rank_) {
    absl::Status put = mailbox_.Put(key, std::move(tensor));
    if (!put.ok() && mailbox_.status().ok()) mailbox_.Abort(put);
    return;
  }
  auto shared = std::make_shared<const math::Matrix>(std::move(tensor));
  PeerLink* link = nullptr;
  {
    absl::MutexLock lock(&links_mu_);
    if (closed_) return;
    auto it = peers_.find(owner);
    if (it == peers_.end()) {
      mailbox_.Abort(
          absl::InternalError(absl::StrCat("rank ", rank_, " has no route for ", key.ToString())));
      return;
    }
    if (it->second.link == nullptr) {
      it->second.pending.emplace_back(key, std::move(shared));
      return;
    }
    link = it->second.link.get();  // lives until Stop(), which joins this thread first.
  }
  if (absl::Status s = link->Send(key, std::move(shared)); !s.ok()) mailbox_.Abort(s);
}

void StageWorkerDaemon::Job::OnRunStep(const v1::RunStep& run) {
  if (!dialled_) {
    dialled_ = true;
    DialPeers();
  }
  requested_step_ = run.step();
  const int64_t run_index = ++requested_runs_;
  const int64_t step = run.step();
  const int64_t rows = run.batch_rows();
  Post([this, step, rows, run_index] {
    absl::Status broken;
    {
      absl::MutexLock lock(&links_mu_);
      broken = broken_;
    }
    if (pacer_ != nullptr) pacer_->BeginStep(step, rows);
    absl::StatusOr<StepReport> report =
        broken.ok() ? executor_->RunStep(step, actions_, rows) : absl::StatusOr<StepReport>(broken);
    if (pacer_ != nullptr && report.ok()) {
      pacer_->EndStep();
      pacer_->RewriteTimings(&*report);
    }
    bool aborted = false;
    {
      absl::MutexLock lock(&state_mu_);
      ++finished_runs_;
      last_step_failed_ = !report.ok();
      aborted = aborted_run_ == run_index;
    }
    // Clean up before answering, so that the answer tells the coordinator that this worker is
    // ready for the next RunStep (also a re-run of this step): the mailbox is reset after the
    // coordinator's Abort (unless a link broke: the epoch is over), a failed step's leftovers
    // are dropped and the executor discards the failed step at once.
    if (aborted && broken.ok()) {
      mailbox_.Reset();
    } else if (!report.ok()) {
      mailbox_.ClearStep(step);
    }
    if (!report.ok()) executor_->Abort();
    step_ok_ = report.ok() && !aborted;
    ran_step_ = step;
    if (!report.ok()) {
      EmitError(step, report.status());
      return;
    }
    v1::WorkerEvent event;
    *event.mutable_step_done() = StepDoneFromReport(job_, epoch_, *report);
    Emit(std::move(event));
  });
}

void StageWorkerDaemon::Job::OnCommit(const v1::Commit& commit) {
  const int64_t step = commit.step();
  const float clip_scale = commit.clip_scale();
  Post([this, step, clip_scale] {
    if (!step_ok_ || ran_step_ != step) {
      EmitError(step, absl::FailedPreconditionError(absl::StrCat(
                          "Commit(", step, "): step ", step, " has not run successfully here")));
      return;
    }
    step_ok_ = false;
    // Steps are numbered from 0: step n is the (n+1)-th optimizer update.
    if (absl::Status s = executor_->Commit(step + 1, clip_scale); !s.ok()) {
      EmitError(step, s);
      return;
    }
    mailbox_.ClearStep(step);
    v1::WorkerEvent event;
    v1::Committed* committed = event.mutable_committed();
    committed->set_job(job_);
    committed->set_epoch(epoch_);
    committed->set_step(step);
    Emit(std::move(event));
  });
}

void StageWorkerDaemon::Job::OnAbort(const v1::Abort& abort) {
  if (abort.step() != requested_step_) {
    daemon_->Log(absl::StrCat("ignoring Abort(", abort.step(), ") of job ", job_, " epoch ", epoch_,
                              ": the latest step is ", requested_step_));
    return;
  }
  {
    // Atomic with the compute thread's end-of-run bookkeeping: either the run is still queued
    // or running (then it is woken here and resets the mailbox itself before it answers), or it
    // has answered already (then the mailbox is left alone: a re-run's inputs may be in it).
    absl::MutexLock lock(&state_mu_);
    if (finished_runs_ < requested_runs_) {
      aborted_run_ = requested_runs_;
      mailbox_.Abort(absl::AbortedError(
          absl::StrCat("step ", abort.step(), " aborted by the coordinator: ", abort.reason())));
    }
  }
  Post([this] {
    executor_->Abort();
    step_ok_ = false;
    absl::MutexLock lock(&links_mu_);
    // Outputs of the aborted run still waiting for a lower-rank peer's stream are dropped, so
    // a re-run of the step cannot deliver them twice.
    for (auto& [rank, slot] : peers_) slot.pending.clear();
  });
}

void StageWorkerDaemon::Job::OnSaveShards(const v1::SaveShards& save) {
  const int64_t step = save.step();
  const std::string directory = save.directory();
  Post([this, step, directory] {
    absl::Status s = directory.empty() ? absl::InvalidArgumentError("SaveShards: empty directory")
                                       : model::WriteCheckpointShards(
                                             directory, shards_, executor_->ExportState(), step)
                                             .status();
    if (!s.ok()) {
      EmitError(step, s);
      return;
    }
    v1::WorkerEvent event;
    v1::ShardsSaved* saved = event.mutable_shards_saved();
    saved->set_job(job_);
    saved->set_epoch(epoch_);
    saved->set_step(step);
    Emit(std::move(event));
  });
}

void StageWorkerDaemon::Job::OnLinkFailed(const absl::Status& status, bool coordinator_link) {
  if (coordinator_link) {
    // The coordinator sees its own stream fail: it aborts the step it was feeding (Abort) and
    // dials a new feed stream for the next one; if it died, the control stream ends too.
    // Deciding here would race with the replacement stream, so this is only logged.
    daemon_->Log(absl::StrCat("feed stream ended: ", status.ToString()));
    return;
  }
  int64_t step = 0;
  {
    absl::MutexLock lock(&state_mu_);
    // A queued or running step fails on the aborted mailbox (or the broken link) and reports
    // the error itself; a step that failed already told the coordinator.
    if (finished_runs_ < requested_runs_ || last_step_failed_) return;
    step = std::max<int64_t>(requested_step_, 0);
  }
  EmitError(step, status);
}

// ---------------------------------------------------------------------------------------------
// StageWorkerDaemon

absl::StatusOr<std::unique_ptr<StageWorkerDaemon>> StageWorkerDaemon::Start(
    const StageWorkerOptions& options) {
  if (absl::Status s = options.Check(); !s.ok()) return s;
  static std::once_flag pinned;
  std::call_once(pinned, [] { math::PinEigenBlockingForReproducibility(); });
  // The speed the coordinator partitions by: given, else the emulated rate (what the actions will
  // really take), else measured.
  const double gflops = options.gflops > 0           ? options.gflops
                        : options.emulate_gflops > 0 ? options.emulate_gflops
                                                     : MeasureGflops();
  std::unique_ptr<StageWorkerDaemon> daemon(new StageWorkerDaemon(options, gflops));
  if (absl::Status s = daemon->StartServer(); !s.ok()) return s;
  daemon->Log(absl::StrFormat("serving on %s (listen %s), %.2f GFLOP/s, coordinator %s",
                              daemon->address_, options.listen, gflops, options.coordinator));
  if (options.emulate_gflops > 0) {
    daemon->Log(absl::StrFormat("emulating %.3f GFLOP/s: actions are paced to FLOPs / rate",
                                options.emulate_gflops));
  }
  daemon->command_thread_ = std::thread([raw = daemon.get()] { raw->CommandLoop(); });
  daemon->session_thread_ = std::thread([raw = daemon.get()] { raw->SessionLoop(); });
  return daemon;
}

StageWorkerDaemon::StageWorkerDaemon(const StageWorkerOptions& options, double gflops)
    : options_(options), gflops_(gflops) {}

StageWorkerDaemon::~StageWorkerDaemon() { Shutdown(); }

absl::Status StageWorkerDaemon::StartServer() {
  absl::StatusOr<std::unique_ptr<ExchangeService>> exchange = ExchangeService::Create(
      options_.link, [this](const PeerHello& hello, std::unique_ptr<PeerLink> link) {
        return Accept(hello, std::move(link));
      });
  if (!exchange.ok()) return exchange.status();
  exchange_ = *std::move(exchange);
  grpc::EnableDefaultHealthCheckService(true);
#ifdef PIPETRAIN_HAVE_GRPC_REFLECTION
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
#endif
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.listen, grpc::InsecureServerCredentials(), &port_);
  exchange_->RegisterOn(&builder);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.listen));
  }
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    health->SetServingStatus(true);
  }
  if (!options_.advertise.empty()) {
    address_ = options_.advertise;
  } else {
    std::string host, port;
    SplitHostPort(options_.listen, &host, &port);
    if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") host = HostName();
    address_ = absl::StrCat(host, ":", port_);
  }
  name_ = options_.name.empty() ? address_ : options_.name;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, static_cast<int>(wire::kMaxFrameMessageBytes));
  coordinator_channel_ =
      grpc::CreateCustomChannel(options_.coordinator, grpc::InsecureChannelCredentials(), args);
  coordinator_stub_ = v1::Coordinator::NewStub(coordinator_channel_);
  return absl::OkStatus();
}

void StageWorkerDaemon::SessionLoop() {
  absl::Duration backoff = options_.redial_initial;
  for (;;) {
    auto stream = std::make_shared<ControlStream>(this);
    v1::WorkerEvent hello;
    v1::RegisterWorker* reg = hello.mutable_register_();
    reg->set_name(name_);
    reg->set_address(address_);
    reg->set_cores(static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency())));
    reg->set_gflops(gflops_);
    reg->set_memory_bytes(PhysicalMemoryBytes());
    // Published before Begin, so that no event emitted once the coordinator has seen the
    // registration is dropped (they queue behind it).
    bool cancel = false;
    {
      absl::MutexLock lock(&mu_);
      stream_ = stream;
      cancel = stopping_;
    }
    stream->Begin(coordinator_stub_.get(), std::move(hello));
    // gRPC calls are made outside mu_: reactions (which take mu_) may run inline.
    if (cancel) stream->Cancel();
    const absl::Status status = stream->AwaitDone();
    {
      absl::MutexLock lock(&mu_);
      stream_ = nullptr;
    }
    const bool accepted = stream->got_command();
    stream.reset();
    Task lost;
    lost.kind = Task::Kind::kStreamLost;
    lost.status = status;
    Enqueue(std::move(lost));
    if (accepted) backoff = options_.redial_initial;
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    Log(absl::StrCat("control stream to ", options_.coordinator, " ended (", status.ToString(),
                     "); redialling in ", absl::FormatDuration(backoff)));
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), backoff);
    if (stopping_) return;
    backoff = std::min(backoff * 2, options_.redial_max);
  }
}

void StageWorkerDaemon::Enqueue(Task task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  tasks_.push_back(std::move(task));
}

void StageWorkerDaemon::CommandLoop() {
  for (;;) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !tasks_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) break;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    HandleTask(std::move(task));
  }
  DropJob("the worker is shutting down");
}

void StageWorkerDaemon::Emit(v1::WorkerEvent event) {
  std::shared_ptr<ControlStream> stream;
  {
    absl::MutexLock lock(&mu_);
    stream = stream_;
  }
  // Outside mu_: Write may start a gRPC operation. After the stream's OnDone, Write is a no-op.
  if (stream != nullptr) stream->Write(std::move(event));
}

void StageWorkerDaemon::EmitError(const std::string& job, int64_t epoch, int64_t step,
                                  const absl::Status& status) {
  Log(absl::StrCat("error (job ", job, ", epoch ", epoch, ", step ", step,
                   "): ", status.ToString()));
  v1::WorkerEvent event;
  v1::WorkerError* error = event.mutable_error();
  error->set_job(job);
  error->set_epoch(epoch);
  error->set_step(step);
  error->set_code(static_cast<int32_t>(status.code()));
  error->set_message(std::string(status.message()));
  Emit(std::move(event));
}

void StageWorkerDaemon::Log(absl::string_view message) const {
  if (!options_.log) return;
  absl::FPrintF(stderr, "%s stage_worker[%s] %s\n",
                absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
                name_.empty() ? options_.listen : name_, message);
}

absl::StatusOr<LinkSettings> StageWorkerDaemon::Accept(const PeerHello& hello,
                                                       std::unique_ptr<PeerLink> link) {
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&job_mu_);
    job = job_;
  }
  if (job == nullptr) {
    // A restarted or dropped worker (see Job::Accept): ABORTED.
    return absl::AbortedError(absl::StrCat("worker ", name_, " has no job (stream for job '",
                                           hello.identity.job, "'): restarted or dropped"));
  }
  return job->Accept(hello, std::move(link));
}

void StageWorkerDaemon::DropJob(absl::string_view why) {
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&job_mu_);
    job.swap(job_);
  }
  if (job == nullptr) return;
  Log(absl::StrCat("dropping job ", job->id(), " epoch ", job->epoch(), ": ", why));
  job->Stop(why);
}

bool StageWorkerDaemon::CheckCurrent(const std::string& job_id, int64_t epoch, int64_t step,
                                     absl::string_view what) {
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&job_mu_);
    job = job_;
  }
  if (job != nullptr && job->id() == job_id && job->epoch() == epoch) return true;
  if (job != nullptr && job->id() == job_id && epoch < job->epoch()) {
    Log(absl::StrCat("ignoring stale ", what, "(", step, ") of job ", job_id, " epoch ", epoch,
                     " (current epoch ", job->epoch(), ")"));
    EmitError(job_id, epoch, step,
              absl::AbortedError(absl::StrCat(what, "(", step, "): epoch ", epoch,
                                              " is stale, the job is at epoch ", job->epoch())));
    return false;
  }
  EmitError(job_id, epoch, step,
            absl::FailedPreconditionError(absl::StrCat(
                what, "(", step, "): this worker has no job '", job_id, "' at epoch ", epoch,
                job == nullptr
                    ? std::string(" (no job)")
                    : absl::StrCat(" (it runs job '", job->id(), "' epoch ", job->epoch(), ")"))));
  return false;
}

void StageWorkerDaemon::HandleTask(Task task) {
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&job_mu_);
    job = job_;
  }
  switch (task.kind) {
    case Task::Kind::kStreamLost:
      DropJob(absl::StrCat("control stream lost: ", task.status.ToString()));
      return;
    case Task::Kind::kLinkFailed:
      if (job != nullptr && job->id() == task.job && job->epoch() == task.epoch) {
        job->OnLinkFailed(task.status, task.coordinator_link);
      }
      return;
    case Task::Kind::kCommand:
      break;
  }
  const v1::WorkerCommand& command = task.command;
  switch (command.command_case()) {
    case v1::WorkerCommand::kAssign:
      HandleAssign(command.assign());
      return;
    case v1::WorkerCommand::kRunStep: {
      const v1::RunStep& c = command.run_step();
      if (CheckCurrent(c.job(), c.epoch(), c.step(), "RunStep")) job->OnRunStep(c);
      return;
    }
    case v1::WorkerCommand::kCommit: {
      const v1::Commit& c = command.commit();
      if (CheckCurrent(c.job(), c.epoch(), c.step(), "Commit")) job->OnCommit(c);
      return;
    }
    case v1::WorkerCommand::kAbort: {
      const v1::Abort& c = command.abort();
      if (CheckCurrent(c.job(), c.epoch(), c.step(), "Abort")) job->OnAbort(c);
      return;
    }
    case v1::WorkerCommand::kSaveShards: {
      const v1::SaveShards& c = command.save_shards();
      if (CheckCurrent(c.job(), c.epoch(), c.step(), "SaveShards")) job->OnSaveShards(c);
      return;
    }
    case v1::WorkerCommand::COMMAND_NOT_SET:
      EmitError("", 0, 0, absl::InvalidArgumentError("empty WorkerCommand"));
      return;
  }
}

void StageWorkerDaemon::HandleAssign(const v1::Assign& assign) {
  DropJob(absl::StrCat("replaced by Assign(job ", assign.job(), ", epoch ", assign.epoch(), ")"));
  absl::StatusOr<std::shared_ptr<Job>> job = Job::Create(assign, this);
  if (!job.ok()) {
    EmitError(assign.job(), assign.epoch(), 0, job.status());
    return;
  }
  {
    absl::MutexLock lock(&job_mu_);
    job_ = *job;
  }
  Log(absl::StrCat("assigned job ", assign.job(), " epoch ", assign.epoch(), " rank ",
                   assign.rank(), " of ", assign.stages()));
  v1::WorkerEvent event;
  v1::Assigned* assigned = event.mutable_assigned();
  assigned->set_job(assign.job());
  assigned->set_epoch(assign.epoch());
  Emit(std::move(event));
}

void StageWorkerDaemon::Shutdown() {
  absl::MutexLock serial(&shutdown_mu_);
  std::shared_ptr<ControlStream> stream;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopping_ = true;
    tasks_.clear();
    stream = stream_;
  }
  if (stream != nullptr) stream->Cancel();
  if (session_thread_.joinable()) session_thread_.join();
  if (command_thread_.joinable()) command_thread_.join();  // drops the job on its way out.
  DropJob("the worker is shutting down");
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  absl::MutexLock lock(&mu_);
  stopped_ = true;
}

void StageWorkerDaemon::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&stopping_));
}

}  // namespace pipetrain::worker
