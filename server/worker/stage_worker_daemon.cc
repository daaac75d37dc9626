#include "server/worker/stage_worker_daemon.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/math/kernels.h"
#include "common/partition/partitioner.h"
#include "common/plan/speed_probe.h"
#include "common/util/cpu_set.h"
#include "common/util/heap_tuning.h"
#include "common/util/status_macros.h"
#include "common/wire/grpc_status.h"
#include "pipetrain/v1/worker.grpc.pb.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/control/control_proto.h"
#include "server/introspection/introspection.h"
#include "server/logging/daemon_log.h"
#include "server/worker/layer_profiler.h"

namespace pipetrain::worker {

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
  if (!(gflops == 0 || (gflops >= partition::kMinSpeed && gflops <= partition::kMaxSpeed))) {
    return absl::InvalidArgumentError(absl::StrCat("--gflops must be in [", partition::kMinSpeed,
                                                   ", ", partition::kMaxSpeed, "], got ", gflops));
  }
  if (redial_initial <= absl::ZeroDuration() || redial_max < redial_initial) {
    return absl::InvalidArgumentError("redial backoff needs 0 < redial_initial <= redial_max");
  }
  if (keepalive < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("keepalive must be >= 1s, got ", absl::FormatDuration(keepalive)));
  }
  if (max_message_bytes < (int64_t{2} << 20) || max_message_bytes > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-message-size must be in [2 MiB, 2 GiB), got ", max_message_bytes, " bytes"));
  }
  if (max_tensor_bytes < 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-tensor-bytes must be >= 4, got ", max_tensor_bytes));
  }
  if (max_concurrent_streams < 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-concurrent-streams must be >= 4, got ", max_concurrent_streams));
  }
  if (absl::StatusOr<math::Isa> isa = math::HighestSupportedIsa(max_isa); !isa.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("--max-isa: ", isa.status().message()));
  }
  if (link_connections < 0 || link_connections > link::kMaxLinkConnections) {
    return absl::InvalidArgumentError(absl::StrCat("--link-connections must be auto or in [1, ",
                                                   link::kMaxLinkConnections, "], got ",
                                                   link_connections));
  }
  if (absl::Status s = tls.Check(/*need_identity=*/true); !s.ok()) return s;
  if (absl::Status s = net::CheckListenSecurity("--listen", listen, tls.enabled(), insecure);
      !s.ok()) {
    return s;
  }
  return link.Check();
}

absl::StatusOr<WorkerSpeed> ChooseWorkerSpeed(const StageWorkerOptions& options, math::Isa isa) {
  if (options.gflops > 0) return WorkerSpeed{options.gflops, "given by --gflops"};
  if (options.emulate_gflops > 0) {
    return WorkerSpeed{options.emulate_gflops, "emulated, --emulate-gflops"};
  }
  const math::Kernels& kernels = math::KernelsFor(isa);
  // One 256^3 product per sample (MeasureGemmGflops stops after the first product past 0 s).
  PT_ASSIGN_OR_RETURN(const plan::SpeedProbe probe,
                      plan::ProbeSpeed([&kernels] { return kernels.MeasureGemmGflops(0); }));
  return WorkerSpeed{probe.speed, absl::StrFormat("probe: 90th percentile of %d sgemm samples, "
                                                  "median %.2f",
                                                  probe.samples, probe.median)};
}

// ---------------------------------------------------------------------------------------------
// StageWorkerDaemon

absl::StatusOr<std::unique_ptr<StageWorkerDaemon>> StageWorkerDaemon::Start(
    const StageWorkerOptions& options) {
  if (absl::Status s = options.Check(); !s.ok()) return s;
  const std::vector<math::Isa> isas = math::SupportedIsas(options.max_isa);  // Check: not empty.
  // Each level pins its own copy of Eigen's GEMM blocking (its jobs set their thread count).
  static std::once_flag pinned;
  std::call_once(pinned, [] {
    for (math::Isa isa : math::SupportedIsas()) math::KernelsFor(isa).ConfigureEigen(1);
  });
  PT_ASSIGN_OR_RETURN(const WorkerSpeed speed, ChooseWorkerSpeed(options, isas.back()));
  std::unique_ptr<StageWorkerDaemon> daemon(new StageWorkerDaemon(options, speed.gflops));
  if (absl::Status s = daemon->StartServer(); !s.ok()) return s;
  daemon->Log(absl::StrFormat(
      "serving on %s (listen %s), %.2f GFLOP/s (%s), instruction sets %s, coordinator %s",
      daemon->address_, options.listen, speed.gflops, speed.source, math::IsaListName(isas),
      options.coordinator));
  if (options.tls.enabled()) {
    // Checked by StartServer; the line names the certificate and its expiry.
    absl::StatusOr<std::string> tls = net::CheckTlsFiles(options.tls);
    daemon->Log(tls.ok() ? *tls : tls.status().ToString());
    daemon->certificate_watcher_ = std::make_unique<net::CertificateWatcher>(
        options.tls, options.tls.refresh_interval,
        [raw = daemon.get()](const std::string& line) { raw->Log(line); });
  } else if (!net::IsLoopbackAddress(options.listen)) {
    daemon->Log("--insecure: plaintext gRPC, anyone who reaches this port can open data streams");
  }
  if (options.emulate_gflops > 0) {
    daemon->Log(absl::StrFormat("emulating %.3f GFLOP/s: actions are paced to FLOPs / rate",
                                options.emulate_gflops));
  }
  daemon->link_prober_ = std::make_unique<LinkProber>(
      daemon->name_, daemon->channel_credentials_, WorkerProbeOptions(options.link),
      [raw = daemon.get()](v1::WorkerEvent event) { raw->Emit(std::move(event)); });
  LayerProfilerOptions profiler;
  profiler.name = daemon->name_;
  profiler.gflops = daemon->gflops_;
  profiler.threads_max = options.threads_max > 0 ? options.threads_max : util::UsableCpuCount();
  profiler.max_isa = options.max_isa;
  daemon->profiler_ = std::make_unique<LayerProfiler>(
      profiler, [raw = daemon.get()](v1::WorkerEvent event) { raw->Emit(std::move(event)); });
  daemon->command_thread_ = std::thread([raw = daemon.get()] { raw->CommandLoop(); });
  daemon->session_thread_ = std::thread([raw = daemon.get()] { raw->SessionLoop(); });
  return daemon;
}

StageWorkerDaemon::StageWorkerDaemon(const StageWorkerOptions& options, double gflops)
    : options_(options), gflops_(gflops) {}

StageWorkerDaemon::~StageWorkerDaemon() { Shutdown(); }

absl::Status StageWorkerDaemon::StartServer() {
  absl::StatusOr<std::unique_ptr<link::ExchangeService>> exchange = link::ExchangeService::Create(
      options_.link, [this](const link::PeerHello& hello, std::unique_ptr<link::PeerLink> link) {
        return Accept(hello, std::move(link));
      });
  if (!exchange.ok()) return exchange.status();
  exchange_ = *std::move(exchange);
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> server_credentials =
      net::MakeServerCredentials(options_.tls);
  if (!server_credentials.ok()) return server_credentials.status();
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> channel_credentials =
      net::MakeChannelCredentials(options_.tls);
  if (!channel_credentials.ok()) return channel_credentials.status();
  channel_credentials_ = *std::move(channel_credentials);
  grpc::ServerBuilder builder;
  introspection::AddHealthAndReflection(&builder);
  builder.AddListeningPort(options_.listen, *server_credentials, &port_);
  exchange_->RegisterOn(&builder);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options_.max_concurrent_streams);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.listen));
  }
  introspection::SetServing(server_.get(), {v1::StageWorker::service_full_name()});
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
  const int keepalive_ms = static_cast<int>(
      std::min<int64_t>(absl::ToInt64Milliseconds(options_.keepalive), int64_t{1} << 30));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, keepalive_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, std::max(keepalive_ms, 10000));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Keep pinging while the control stream is idle (gRPC stops after 2 pings without data by
  // default), so a frozen coordinator is noticed between jobs too.
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, static_cast<int>(options_.max_message_bytes));
  // gRPC's own reconnect backoff (up to 120 s by default) must not outlast ours: a restarted
  // coordinator is found within redial_max.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(options_.redial_max),
                                                 int64_t{1} << 30)));
  coordinator_channel_ =
      grpc::CreateCustomChannel(options_.coordinator, channel_credentials_, args);
  coordinator_stub_ = v1::WorkerControl::NewStub(coordinator_channel_);
  return absl::OkStatus();
}

void StageWorkerDaemon::SessionLoop() {
  absl::Duration backoff = options_.redial_initial;
  std::minstd_rand jitter(std::random_device{}());
  for (;;) {
    auto stream = std::make_shared<ControlStream>([this](v1::WorkerCommand command) {
      Task task;
      task.kind = Task::Kind::kCommand;
      task.command = std::move(command);
      Enqueue(std::move(task));
    });
    v1::WorkerEvent hello;
    v1::RegisterWorker* reg = hello.mutable_register_();
    reg->set_name(name_);
    reg->set_address(address_);
    reg->set_cores(util::UsableCpuCount());
    reg->set_gflops(gflops_);
    reg->set_memory_bytes(PhysicalMemoryBytes());
    reg->set_incarnation(incarnation_);
    for (math::Isa isa : math::SupportedIsas(options_.max_isa)) {
      reg->add_isa_levels(std::string(math::IsaName(isa)));
    }
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
    // Jitter: a restarted coordinator is not redialled by every worker at the same instant.
    const absl::Duration pause = backoff * std::uniform_real_distribution<double>(0.5, 1.0)(jitter);
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    Log(absl::StrCat("control stream to ", options_.coordinator, " ended (", status.ToString(),
                     "); redialling in ", absl::FormatDuration(pause)));
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), pause);
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

void StageWorkerDaemon::LinkFailed(const std::string& job, int64_t generation,
                                   const absl::Status& status, bool coordinator_link) {
  Task task;
  task.kind = Task::Kind::kLinkFailed;
  task.job = job;
  task.generation = generation;
  task.status = status;
  task.coordinator_link = coordinator_link;
  Enqueue(std::move(task));
}

void StageWorkerDaemon::Log(absl::string_view message, logging::LogLevel level) const {
  if (!options_.log) return;
  logging::Log(absl::StrCat("stage_worker[", name_.empty() ? options_.listen : name_, "]"), level,
               message);
}

absl::StatusOr<link::LinkSettings> StageWorkerDaemon::Accept(const link::PeerHello& hello,
                                                             std::unique_ptr<link::PeerLink> link) {
  // Another worker measuring its link to this one (its LinkProber): answered whatever the job.
  if (hello.identity.job == link::kLinkProbeJob) {
    return probe_answerer_.Accept(hello, std::move(link));
  }
  std::shared_ptr<WorkerJob> job;
  {
    absl::MutexLock lock(&job_mu_);
    job = job_;
  }
  if (job == nullptr) {
    // A restarted or dropped worker (see WorkerJob::Accept): ABORTED.
    return absl::AbortedError(absl::StrCat("worker ", name_, " has no job (stream for job '",
                                           hello.identity.job, "'): restarted or dropped"));
  }
  return job->Accept(hello, std::move(link));
}

void StageWorkerDaemon::DropJob(absl::string_view why) {
  std::shared_ptr<WorkerJob> job;
  {
    absl::MutexLock lock(&job_mu_);
    job.swap(job_);
  }
  if (job == nullptr) return;
  Log(absl::StrCat("dropping job ", job->id(), " generation ", job->generation(), ": ", why));
  job->Stop(why);
  // Usually the last reference: the job's model, caches and buffers are freed here. Whatever is
  // free now goes back to the kernel (a later job's memory is freed by a later drop).
  job.reset();
  util::ReturnFreeHeapToKernel();
}

bool StageWorkerDaemon::CheckCurrent(const std::string& job_id, int64_t generation, int64_t step,
                                     absl::string_view what) {
  std::shared_ptr<WorkerJob> job;
  {
    absl::MutexLock lock(&job_mu_);
    job = job_;
  }
  if (job != nullptr && job->id() == job_id && job->generation() == generation) return true;
  if (job != nullptr && job->id() == job_id && generation < job->generation()) {
    Log(absl::StrCat("ignoring stale ", what, "(", step, ") of job ", job_id, " generation ",
                     generation, " (current generation ", job->generation(), ")"));
    EmitError(job_id, generation, step,
              absl::AbortedError(absl::StrCat(what, "(", step, "): generation ", generation,
                                              " is stale, the job is at generation ",
                                              job->generation())));
    return false;
  }
  EmitError(
      job_id, generation, step,
      absl::FailedPreconditionError(absl::StrCat(
          what, "(", step, "): this worker has no job '", job_id, "' at generation ", generation,
          job == nullptr ? std::string(" (no job)")
                         : absl::StrCat(" (it runs job '", job->id(), "' generation ",
                                        job->generation(), ")"))));
  return false;
}

void StageWorkerDaemon::HandleTask(Task task) {
  std::shared_ptr<WorkerJob> job;
  {
    absl::MutexLock lock(&job_mu_);
    job = job_;
  }
  switch (task.kind) {
    case Task::Kind::kStreamLost:
      // Its answer could reach no one: the coordinator forgets a profile with its stream.
      profiler_->Stop("the control stream was lost");
      DropJob(absl::StrCat("control stream lost: ", task.status.ToString()));
      return;
    case Task::Kind::kLinkFailed:
      if (job != nullptr && job->id() == task.job && job->generation() == task.generation) {
        job->OnLinkFailed(task.status, task.coordinator_link);
      }
      return;
    case Task::Kind::kCommand:
      HandleCommand(task.command, job);
      return;
  }
}

void StageWorkerDaemon::HandleCommand(const v1::WorkerCommand& command,
                                      const std::shared_ptr<WorkerJob>& job) {
  switch (command.command_case()) {
    case v1::WorkerCommand::kAssign:
      HandleAssign(command.assign());
      return;
    case v1::WorkerCommand::kRunStep: {
      const v1::RunStep& c = command.run_step();
      if (CheckCurrent(c.job(), c.generation(), c.step(), "RunStep")) job->OnRunStep(c);
      return;
    }
    case v1::WorkerCommand::kCommit: {
      const v1::Commit& c = command.commit();
      if (CheckCurrent(c.job(), c.generation(), c.step(), "Commit")) job->OnCommit(c);
      return;
    }
    case v1::WorkerCommand::kAbort: {
      const v1::Abort& c = command.abort();
      if (CheckCurrent(c.job(), c.generation(), c.step(), "Abort")) job->OnAbort(c);
      return;
    }
    case v1::WorkerCommand::kEvalRun: {
      const v1::EvalRun& c = command.eval_run();
      if (CheckCurrent(c.job(), c.generation(), c.step(), "EvalRun")) job->OnEvalRun(c);
      return;
    }
    case v1::WorkerCommand::kGenRun: {
      const v1::GenRun& c = command.gen_run();
      if (CheckCurrent(c.job(), c.generation(), c.step(), "GenRun")) job->OnGenRun(c);
      return;
    }
    case v1::WorkerCommand::kSaveShards: {
      const v1::SaveShards& c = command.save_shards();
      if (CheckCurrent(c.job(), c.generation(), c.step(), "SaveShards")) job->OnSaveShards(c);
      return;
    }
    case v1::WorkerCommand::kRelease: {
      // Not answered: a worker that does not run (job, generation) any more has nothing to drop.
      const v1::Release& c = command.release();
      if (job != nullptr && job->id() == c.job() && job->generation() <= c.generation()) {
        DropJob(absl::StrCat("released by the coordinator: ", c.reason()));
      }
      return;
    }
    case v1::WorkerCommand::kOpenLinks: {
      // Not answered: a hint the first RunStep would also act on.
      const v1::OpenLinks& c = command.open_links();
      if (job != nullptr && job->id() == c.job() && job->generation() == c.generation())
        job->OnOpenLinks();
      return;
    }
    case v1::WorkerCommand::kProbeLinks:
      // Answered with LinksProbed, from the prober's thread.
      link_prober_->Start(command.probe_links());
      return;
    case v1::WorkerCommand::kProfileLayers:
      HandleProfile(command.profile_layers(), job);
      return;
    case v1::WorkerCommand::COMMAND_NOT_SET:
      EmitError("", 0, 0, absl::InvalidArgumentError("empty WorkerCommand"));
      return;
  }
}

void StageWorkerDaemon::HandleProfile(const v1::ProfileLayers& command,
                                      const std::shared_ptr<WorkerJob>& job) {
  if (job == nullptr) {
    Log(absl::StrCat("timing the layers of a model for profile ", command.profile(), " (",
                     command.samples_size(), " micro-batch sizes)"));
    profiler_->Start(command);
    return;
  }
  v1::WorkerEvent event;
  v1::LayersProfiled* answer = event.mutable_layers_profiled();
  answer->set_profile(command.profile());
  answer->set_code(static_cast<int32_t>(absl::StatusCode::kFailedPrecondition));
  answer->set_message(absl::StrCat("worker ", name_, " holds a stage of job '", job->id(),
                                   "' (generation ", job->generation(),
                                   "): it times layers only when idle"));
  answer->set_gflops(gflops_);
  Emit(std::move(event));
}

void StageWorkerDaemon::HandleAssign(const v1::Assign& assign) {
  // A job's compute must not share the CPUs with a profile (nor its Eigen thread count).
  if (profiler_->running()) Log("an Assign arrived: stopping the layer profile");
  profiler_->Stop(
      absl::StrCat("Assign(job ", assign.job(), ", generation ", assign.generation(), ") arrived"));
  DropJob(absl::StrCat("replaced by Assign(job ", assign.job(), ", generation ",
                       assign.generation(), ")"));
  WorkerJobOptions job_options;
  job_options.emulate_gflops = options_.emulate_gflops;
  job_options.threads_max =
      options_.threads_max > 0 ? options_.threads_max : util::UsableCpuCount();
  job_options.link = options_.link;
  job_options.link_connections = options_.link_connections;
  job_options.metrics = options_.metrics;
  job_options.max_tensor_bytes = options_.max_tensor_bytes;
  job_options.link_credentials = channel_credentials_;
  job_options.max_isa = options_.max_isa;
  absl::StatusOr<std::shared_ptr<WorkerJob>> job = WorkerJob::Create(assign, job_options, this);
  if (!job.ok()) {
    EmitError(assign.job(), assign.generation(), 0, job.status());
    return;
  }
  {
    absl::MutexLock lock(&job_mu_);
    job_ = *job;
  }
  Log(absl::StrCat("assigned job ", assign.job(), " generation ", assign.generation(), " rank ",
                   assign.rank(), " of ", assign.stages(), " at instruction set ",
                   assign.isa().empty() ? math::IsaName(math::BuiltIsas().front()) : assign.isa()));
  v1::WorkerEvent event;
  v1::Assigned* assigned = event.mutable_assigned();
  assigned->set_job(assign.job());
  assigned->set_generation(assign.generation());
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
  if (link_prober_ != nullptr) link_prober_->Stop();
  if (profiler_ != nullptr) profiler_->Stop("the worker is shutting down");
  DropJob("the worker is shutting down");
  probe_answerer_.Shutdown();
  if (server_ != nullptr) {
    introspection::SetNotServing(server_.get());
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  certificate_watcher_.reset();
  absl::MutexLock lock(&mu_);
  stopped_ = true;
}

void StageWorkerDaemon::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&stopping_));
}

}  // namespace pipetrain::worker
