#include "server/worker/compute_pacer.h"

#include <algorithm>

#include "absl/time/time.h"

namespace pipetrain::worker {

using wire::TensorKey;
using wire::TensorKind;

ComputePacer::ComputePacer(double gflops) : flops_per_second_(gflops * 1e9) {}

void ComputePacer::Configure(const model::Model* model, std::vector<schedule::Action> actions,
                             std::vector<std::pair<int64_t, int64_t>> chunk_layers,
                             int num_chunks) {
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

void ComputePacer::BeginStep(int64_t step, int64_t batch_rows) {
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

void ComputePacer::BeforeSend(const TensorKey& key) {
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

void ComputePacer::EndStep() {
  absl::MutexLock lock(&mu_);
  if (actions_.empty()) return;
  SleepUntilLocked(AdvanceLocked(static_cast<int>(actions_.size()) - 1));
}

void ComputePacer::RewriteTimings(StepReport* report) {
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
    t.output = t.end;  // an emulated action's output is timed at its (paced) end.
    report->wait_time += t.wait();
    report->compute_time += t.compute();
  }
}

void ComputePacer::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
}

void ComputePacer::OnWaitStart(const TensorKey& key) {}

void ComputePacer::OnWaitEnd(const TensorKey& key) {
  auto it = take_index_.find(Slot(key.microbatch, key.chunk, key.kind));
  if (it == take_index_.end()) return;
  const Clock::time_point now = Clock::now();
  absl::MutexLock lock(&mu_);
  if (key.step != step_ || ready_.empty()) return;
  ready_[it->second] = std::max(ready_[it->second], now);
}

int64_t ComputePacer::Slot(int mb, int chunk, TensorKind kind) const {
  return (static_cast<int64_t>(mb) * (num_chunks_ + 2) + (chunk + 1)) * 8 +
         static_cast<int64_t>(kind);
}

int ComputePacer::Microbatches() const {
  int m = 0;
  for (const schedule::Action& a : actions_) m = std::max(m, a.mb + 1);
  return m;
}

double ComputePacer::ActionFlops(size_t i, int64_t rows) const {
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

void ComputePacer::SleepUntilLocked(Clock::time_point until) {
  const Clock::duration left = until - Clock::now();
  if (left <= Clock::duration::zero() || cancelled_) return;
  mu_.AwaitWithTimeout(absl::Condition(&cancelled_), absl::FromChrono(left));
}

ComputePacer::Clock::time_point ComputePacer::AdvanceLocked(int k) {
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

}  // namespace pipetrain::worker
