// WorkerJob's decode rounds of a Generate request (GenRun): the chunks' incremental forward with
// the request's KV caches held by the executor, on the compute thread between two steps,
// answered by GenDone.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/wire/eval_key.h"
#include "server/worker/worker_job.h"

namespace pipetrain::worker {

void WorkerJob::OnGenRun(const v1::GenRun& run) {
  OnOpenLinks();
  // Counted as a RunStep: one answer per run, and Abort(step) wakes it (and frees the caches).
  requested_step_ = run.step();
  const int64_t run_index = ++requested_runs_;
  std::vector<DecodeMicrobatch> mbs;
  for (const v1::DecodeMicrobatch& m : run.runs()) {
    mbs.push_back(DecodeMicrobatch{m.sequence(), m.position(), m.restart(), m.rows()});
  }
  const int64_t last =
      run.step() +
      std::max<int64_t>(
          0, wire::EvalSteps(static_cast<int64_t>(mbs.size()), std::max(1, microbatches_)) - 1);
  Post([this, run, last, mbs = std::move(mbs), run_index] {
    absl::Status broken;
    {
      absl::MutexLock lock(&links_mu_);
      broken = broken_;
    }
    const bool links_ok = broken.ok();
    if (links_ok && run.open()) broken = executor_->StartDecode(run.request(), run.sequences());
    absl::StatusOr<DecodeReport> report =
        broken.ok() ? executor_->RunDecode(run.request(), run.step(), mbs, microbatches_)
                    : absl::StatusOr<DecodeReport>(broken);
    if (run.close() || !report.ok()) executor_->EndDecode();
    if (report.ok()) FlushPeerLinks(run_index);
    bool aborted = false;
    {
      absl::MutexLock lock(&state_mu_);
      ++finished_runs_;
      last_step_failed_ = !report.ok();
      aborted = aborted_run_ == run_index;
    }
    // As after an EvalRun: the round's keys are its own, dropped either way.
    if (aborted && links_ok) {
      mailbox_.Reset();
      link_spans_.Clear();
    } else {
      for (int64_t s = run.step(); s <= last; ++s) mailbox_.ClearStep(s);
    }
    link_spans_.TakeStep(last, LinkSpanLog::Clock::now(), LinkSpanLog::Clock::now());
    if (!report.ok()) {
      EmitError(run.step(), report.status());
      return;
    }
    v1::WorkerEvent event;
    v1::GenDone* done = event.mutable_gen_done();
    done->set_job(job_);
    done->set_generation(generation_);
    done->set_step(run.step());
    for (const std::vector<float>& logits : report->logits) {
      done->set_vocab(static_cast<int64_t>(logits.size()));
      done->mutable_logits()->Add(logits.begin(), logits.end());
    }
    Emit(std::move(event));
  });
}

}  // namespace pipetrain::worker
