// WorkerJob's evaluation runs: a forward-only pass of the job's chunks (EvalRun), on the compute
// thread between two steps, answered by EvalDone.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/wire/eval_key.h"
#include "server/worker/worker_job.h"

namespace pipetrain::worker {

void WorkerJob::OnEvalRun(const v1::EvalRun& run) {
  OnOpenLinks();
  // Counted as a RunStep: the coordinator expects one answer per run, and Abort(step) of this
  // run wakes it as it wakes a step.
  requested_step_ = run.step();
  const int64_t run_index = ++requested_runs_;
  const int64_t step = run.step();
  std::vector<int64_t> rows(run.microbatch_rows().begin(), run.microbatch_rows().end());
  // Its keys span steps [step, last] (wire::EvalKey: at most M micro-batches per step).
  const int64_t last =
      step +
      std::max<int64_t>(
          0, wire::EvalSteps(static_cast<int64_t>(rows.size()), std::max(1, microbatches_)) - 1);
  Post([this, step, last, rows = std::move(rows), run_index] {
    absl::Status broken;
    {
      absl::MutexLock lock(&links_mu_);
      broken = broken_;
    }
    absl::StatusOr<EvalReport> report = broken.ok()
                                            ? executor_->RunForward(step, rows, microbatches_)
                                            : absl::StatusOr<EvalReport>(broken);
    if (report.ok()) FlushPeerLinks(run_index);
    bool aborted = false;
    {
      absl::MutexLock lock(&state_mu_);
      ++finished_runs_;
      last_step_failed_ = !report.ok();
      aborted = aborted_run_ == run_index;
    }
    // As after a RunStep: clean up before answering. The run's keys are its own (evaluation
    // steps), so whatever is left of them is dropped either way, and so are their link spans.
    if (aborted && broken.ok()) {
      mailbox_.Reset();
      link_spans_.Clear();
    } else {
      for (int64_t s = step; s <= last; ++s) mailbox_.ClearStep(s);
    }
    link_spans_.TakeStep(last, LinkSpanLog::Clock::now(), LinkSpanLog::Clock::now());
    if (!report.ok()) {
      EmitError(step, report.status());
      return;
    }
    v1::WorkerEvent event;
    v1::EvalDone* done = event.mutable_eval_done();
    done->set_job(job_);
    done->set_generation(generation_);
    done->set_step(step);
    for (double l : report->loss_sums) done->add_loss_sums(l);
    for (int64_t c : report->correct) done->add_correct(c);
    Emit(std::move(event));
  });
}

}  // namespace pipetrain::worker
