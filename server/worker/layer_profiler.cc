#include "server/worker/layer_profiler.h"

#include <ctime>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/model/optimizer_proto.h"
#include "common/plan/layer_costs.h"
#include "common/plan/layer_costs_proto.h"
#include "common/util/cpu_set.h"
#include "common/util/status_macros.h"
#include "server/worker/job_plan.h"

namespace pipetrain::worker {
namespace {

using plan::kDefaultProfileDeadlineMs;
using plan::kMaxProfileDeadlineMs;
using plan::kMaxProfileSampleCounts;
using plan::kMaxProfileSamples;

absl::Status ProfileError(const v1::ProfileLayers& c, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("ProfileLayers(", c.profile(), "): ", what));
}

// CPU seconds this process has used (the unit plan::MeasureLayerCosts times in).
double ProcessCpuSeconds() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

// The sample counts, threads and deadline of `c`, checked.
absl::Status CheckProfileShape(const v1::ProfileLayers& c, const LayerProfilerOptions& options,
                               ProfileRequest* request) {
  if (c.samples_size() < 1 || c.samples_size() > kMaxProfileSampleCounts) {
    return ProfileError(c, absl::StrCat(c.samples_size(), " sample counts; ask for 1 to ",
                                        kMaxProfileSampleCounts));
  }
  for (int64_t s : c.samples()) {
    if (s < 1 || s > kMaxProfileSamples) {
      return ProfileError(c, absl::StrCat("a micro-batch of ", s, " samples is outside [1, ",
                                          kMaxProfileSamples, "]"));
    }
    request->samples.push_back(s);
  }
  request->threads = c.threads() == 0 ? 1 : c.threads();
  if (request->threads < 1 || request->threads > options.threads_max) {
    return ProfileError(
        c, absl::StrCat("threads ", c.threads(), " is outside [1, ", options.threads_max, "]"));
  }
  if (c.deadline_ms() < 0 || c.deadline_ms() > kMaxProfileDeadlineMs) {
    return ProfileError(c, absl::StrCat("deadline_ms ", c.deadline_ms(), " is outside [0, ",
                                        kMaxProfileDeadlineMs, "]"));
  }
  request->deadline =
      absl::Milliseconds(c.deadline_ms() == 0 ? kDefaultProfileDeadlineMs : c.deadline_ms());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ProfileRequest> CheckProfileLayers(const v1::ProfileLayers& c,
                                                  const LayerProfilerOptions& options) {
  ProfileRequest request;
  request.profile = c.profile();
  PT_RETURN_IF_ERROR(CheckProfileShape(c, options, &request));
  absl::StatusOr<math::Isa> isa = RunnableIsa(c.isa(), options.max_isa);
  if (!isa.ok()) {
    return absl::Status(isa.status().code(),
                        absl::StrCat("ProfileLayers(", c.profile(), "): ", isa.status().message()));
  }
  absl::StatusOr<std::unique_ptr<model::Model>> net =
      model::Model::Build(c.model(), model::ModelLimits(), *isa);
  if (!net.ok()) return ProfileError(c, absl::StrCat("model: ", net.status().message()));
  request.model = *std::move(net);
  absl::StatusOr<math::OptimizerConfig> optimizer = model::OptimizerFromProto(c.optimizer());
  if (!optimizer.ok()) {
    return ProfileError(c, absl::StrCat("optimizer: ", optimizer.status().message()));
  }
  request.optimizer = *optimizer;
  return request;
}

LayerProfiler::LayerProfiler(LayerProfilerOptions options,
                             std::function<void(v1::WorkerEvent)> emit)
    : options_(std::move(options)), emit_(std::move(emit)) {}

LayerProfiler::~LayerProfiler() { Stop("the worker is shutting down"); }

bool LayerProfiler::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

void LayerProfiler::Start(const v1::ProfileLayers& command) {
  {
    absl::MutexLock lock(&mu_);
    if (running_) {
      emit_(Answer(command.profile(),
                   absl::UnavailableError(
                       absl::StrCat("worker ", options_.name, " is running another layer profile")),
                   {}, 0));
      return;
    }
  }
  if (thread_.joinable()) thread_.join();  // the last profile's thread, done.
  absl::StatusOr<ProfileRequest> request = CheckProfileLayers(command, options_);
  if (!request.ok()) {
    emit_(Answer(command.profile(), request.status(), {}, 0));
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    running_ = true;
    stop_reason_.clear();
  }
  auto shared = std::make_shared<ProfileRequest>(*std::move(request));
  thread_ = std::thread([this, shared] { Run(shared); });
}

void LayerProfiler::RequestStop(absl::string_view why) {
  absl::MutexLock lock(&mu_);
  if (running_ && stop_reason_.empty()) stop_reason_ = std::string(why);
}

void LayerProfiler::Stop(absl::string_view why) {
  RequestStop(why);
  if (thread_.joinable()) thread_.join();
}

void LayerProfiler::Run(const std::shared_ptr<ProfileRequest>& request) {
  const absl::Time deadline = absl::Now() + request->deadline;
  // The CPUs a job of this many threads computes on: the first of those the worker may use.
  const std::vector<std::vector<int>> cpus =
      util::CpuGroups(util::AllowedCpus(), 1, request->threads);
  if (!cpus.empty()) util::ConfineToCpus(cpus[0]).IgnoreError();  // else: unconfined figures.
  const double cpu_start = ProcessCpuSeconds();
  absl::StatusOr<std::vector<v1::SampleLayerCosts>> costs = Measure(*request, deadline);
  const double cpu_seconds = ProcessCpuSeconds() - cpu_start;
  v1::WorkerEvent answer =
      costs.ok() ? Answer(request->profile, absl::OkStatus(), *std::move(costs), cpu_seconds)
                 : Answer(request->profile, costs.status(), {}, cpu_seconds);
  request->model.reset();  // its memory is free before the coordinator hears the answer.
  {
    absl::MutexLock lock(&mu_);
    running_ = false;
  }
  emit_(std::move(answer));
}

absl::StatusOr<std::vector<v1::SampleLayerCosts>> LayerProfiler::Measure(
    const ProfileRequest& request, absl::Time deadline) {
  plan::MeasureOptions measure;
  measure.threads = request.threads;
  std::vector<v1::SampleLayerCosts> out;
  for (int64_t samples : request.samples) {
    if (options_.before_sample_count) options_.before_sample_count(samples);
    {
      absl::MutexLock lock(&mu_);
      if (!stop_reason_.empty()) {
        return absl::AbortedError(absl::StrCat("profile ", request.profile, " on worker ",
                                               options_.name, " stopped: ", stop_reason_));
      }
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "profile ", request.profile, " on worker ", options_.name, " timed ", out.size(), " of ",
          request.samples.size(), " sample counts before its deadline"));
    }
    absl::StatusOr<plan::ModelCosts> costs = plan::MeasureLayerCosts(
        *request.model, samples, request.optimizer, options_.gflops, measure);
    if (!costs.ok()) {
      return absl::Status(
          costs.status().code(),
          absl::StrCat("profile ", request.profile, " on worker ", options_.name,
                       ", micro-batches of ", samples, " samples: ", costs.status().message()));
    }
    out.push_back(plan::LayerSecondsToProto(*costs));
  }
  return out;
}

v1::WorkerEvent LayerProfiler::Answer(int64_t profile, const absl::Status& status,
                                      std::vector<v1::SampleLayerCosts> costs,
                                      double cpu_seconds) const {
  v1::WorkerEvent event;
  v1::LayersProfiled* p = event.mutable_layers_profiled();
  p->set_profile(profile);
  p->set_code(static_cast<int32_t>(status.code()));
  p->set_message(std::string(status.message()));
  p->set_gflops(options_.gflops);
  p->set_cpu_seconds(cpu_seconds);
  for (v1::SampleLayerCosts& c : costs) *p->add_costs() = std::move(c);
  return event;
}

}  // namespace pipetrain::worker
