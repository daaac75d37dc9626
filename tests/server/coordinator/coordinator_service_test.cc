// CoordinatorService against scripted fake workers (real gRPC on 127.0.0.1, real Join streams and
// data links, no model compute): job validation codes and messages, membership, the Train
// stream's rules (bad batches and worker errors leave the job usable, a second Train is refused),
// the step's loss and norm arithmetic, and a lost worker failing the job.
#include "server/coordinator/coordinator_service.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/sdk/client.h"
#include "common/model/checkpoint.h"
#include "common/model/model.h"
#include "common/model/optimizer_proto.h"
#include "common/model/stage.h"
#include "common/schedule/generator.h"
#include "common/util/status_macros.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/worker_control.grpc.pb.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/introspection/introspection.h"
#include "server/link/exchange_service.h"
#include "server/link/peer_link.h"
#include "server/worker/state_transfer.h"
#include "tests/server/coordinator/core_test_fixture.h"
#include "tests/server/coordinator/fake_worker.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::HasSubstr;

v1::JobSpec MakeSpec(int stages, int microbatches, const std::string& schedule = "1f1b") {
  v1::JobSpec spec;
  absl::StatusOr<v1::ModelSpec> model = model::ParseModelSpecText(testing::kTestModel, "test");
  EXPECT_TRUE(model.ok()) << model.status();
  *spec.mutable_model() = *model;
  spec.mutable_optimizer()->mutable_sgd()->set_lr(0.1f);
  spec.set_schedule(schedule);
  spec.set_stages(stages);
  spec.set_microbatches(microbatches);
  spec.set_seed(1);
  spec.set_threads(1);
  return spec;
}

// A batch of `samples` rows for kTestModel: 4 features, class labels in [0, 3).
struct TestBatch {
  math::Matrix inputs;
  math::Matrix targets;
  int64_t samples = 0;
  client::BatchView view() const { return {&inputs, &targets, samples}; }
};

TestBatch MakeBatch(int64_t samples, int64_t features = 4) {
  TestBatch b;
  b.samples = samples;
  b.inputs = math::Matrix::Constant(samples, features, 0.5f);
  b.targets = math::Matrix::Zero(samples, 1);
  for (int64_t r = 0; r < samples; ++r) b.targets(r, 0) = static_cast<float>(r % 3);
  return b;
}

// A scripted stage worker: registers on a Join stream, answers every command at once (StepDone
// with per-micro-batch losses 0.25 * (mb + 1) and norm (layer + 1) for every layer it holds) and
// serves StageWorker.Exchange to receive the coordinator's inputs and targets.
class FakeWorker {
 public:
  FakeWorker(const std::string& coordinator, std::string name, uint64_t incarnation = 0)
      : name_(std::move(name)) {
    auto service = link::ExchangeService::Create(
        link::LinkOptions(),
        [this](const link::PeerHello& hello,
               std::unique_ptr<link::PeerLink> link) -> absl::StatusOr<link::LinkSettings> {
          absl::MutexLock lock(&mu_);
          if (refuse_links_) return absl::UnavailableError("data links refused by the test");
          link::LinkSettings settings;
          settings.validation.expected = hello.identity;
          settings.validation.num_microbatches = microbatches_;
          settings.validation.num_chunks = num_chunks_;
          settings.callbacks.on_tensor = [this](const wire::TensorKey& key, math::Matrix m) {
            absl::MutexLock l(&mu_);
            received_.push_back(key);
            received_rows_ += m.rows();
            return absl::OkStatus();
          };
          links_.push_back(std::move(link));
          return settings;
        });
    EXPECT_TRUE(service.ok()) << service.status();
    exchange_ = std::move(*service);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    exchange_->RegisterOn(&builder);
    server_ = builder.BuildAndStart();
    address_ = absl::StrCat("127.0.0.1:", port);

    channel_ = grpc::CreateChannel(coordinator, grpc::InsecureChannelCredentials());
    stub_ = v1::WorkerControl::NewStub(channel_);
    stream_ = stub_->Join(&context_);
    v1::WorkerEvent reg;
    reg.mutable_register_()->set_name(name_);
    reg.mutable_register_()->set_address(address_);
    reg.mutable_register_()->set_cores(1);
    reg.mutable_register_()->set_gflops(1.0);
    reg.mutable_register_()->set_incarnation(incarnation);
    stream_->Write(reg);
    reader_ = std::thread([this] { ReadLoop(); });
  }

  ~FakeWorker() { Stop(); }

  // Ends the Join stream (the coordinator sees a lost worker) and waits for the reader.
  void Stop() {
    if (stopped_.exchange(true)) return;
    context_.TryCancel();
    reader_.join();
    std::vector<std::unique_ptr<link::PeerLink>> links;
    {
      absl::MutexLock lock(&mu_);
      links.swap(links_);
    }
    for (auto& link : links) link->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
  }

  // Leave RunStep of `step` unanswered until an Abort arrives, then answer it with ABORTED —
  // what a real worker does when the coordinator aborts a step it is running (once).
  void HoldStepUntilAbort(int64_t step) {
    absl::MutexLock lock(&mu_);
    hold_step_ = step;
  }

  // With HoldStepUntilAbort: keep the held run's answer (ABORTED) back after the Abort too, until
  // ReleaseAbortedAnswer (a worker slow to wind the aborted run down).
  void HoldAbortedAnswer() {
    absl::MutexLock lock(&mu_);
    hold_aborted_answer_ = true;
  }
  // Sends the answer HoldAbortedAnswer kept back (waits until the Abort has come).
  void ReleaseAbortedAnswer() {
    v1::WorkerEvent event;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](std::optional<v1::WorkerEvent>* e) { return e->has_value(); }, &aborted_answer_));
      event = *std::move(aborted_answer_);
      aborted_answer_.reset();
    }
    absl::MutexLock lock(&write_mu_);
    stream_->Write(event);
  }

  // Never answer the Commit of `step` (a worker stopped between StepDone and Committed).
  void IgnoreCommit(int64_t step) {
    absl::MutexLock lock(&mu_);
    ignore_commit_step_ = step;
  }

  // Answer the Commit of `step` with a WorkerError instead of Committed (a worker that refuses
  // it: its replica then differs from the others').
  void RefuseCommit(int64_t step) {
    absl::MutexLock lock(&mu_);
    refuse_commit_step_ = step;
  }

  // Report no gradient norms in StepDone (as a worker of a job without clipping does).
  void OmitNorms() {
    absl::MutexLock lock(&mu_);
    omit_norms_ = true;
  }
  // Clip scales of the Commits received, in order.
  std::vector<float> clip_scales() {
    absl::MutexLock lock(&mu_);
    return clip_scales_;
  }

  // Refuse every data link (a worker whose data port is unreachable): the coordinator cannot
  // feed it.
  void RefuseLinks() {
    absl::MutexLock lock(&mu_);
    refuse_links_ = true;
  }
  // RunSteps received (any step).
  int run_steps() {
    absl::MutexLock lock(&mu_);
    return run_steps_;
  }

  // Never answer SaveShards (a worker stopped while the job checkpoints).
  void IgnoreSaveShards() {
    absl::MutexLock lock(&mu_);
    ignore_save_ = true;
  }

  // Answer SaveShards with ShardsSaved without uploading any file (a rogue or broken worker).
  void SkipUploads() {
    absl::MutexLock lock(&mu_);
    skip_uploads_ = true;
  }

  // Fail RunStep of `step` with `status` (once).
  void FailStep(int64_t step, absl::Status status) {
    absl::MutexLock lock(&mu_);
    fail_step_ = step;
    fail_status_ = std::move(status);
  }

  // Blocks until the coordinator answered this worker's registration one way or the other: its
  // stream ended (returns the status) or the coordinator lists it (returns OK).
  absl::Status WaitRegistered(client::Client& client) {
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        if (ended_) return end_status_;
      }
      absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client.ListWorkers();
      if (!workers.ok()) return workers.status();
      for (const v1::WorkerInfo& w : *workers) {
        if (w.name() == name_ && w.address() == address_) return absl::OkStatus();
      }
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&ended_), absl::Milliseconds(5));
    }
  }

  // Blocks until the Join stream ended; returns its status.
  absl::Status WaitEnded() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&ended_));
    return end_status_;
  }

  int aborts() {
    absl::MutexLock lock(&mu_);
    return aborts_;
  }
  // Waits (at most 10 s) until `n` Aborts arrived; returns how many did.
  int WaitAborts(int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return aborts_ >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return aborts_;
  }
  // Waits until a Release of `job` arrived (or the stream ended: false).
  bool WaitReleased(const std::string& job) {
    absl::MutexLock lock(&mu_);
    auto released = [this, &job]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return ended_ || std::find(released_.begin(), released_.end(), job) != released_.end();
    };
    mu_.Await(absl::Condition(&released));
    return std::find(released_.begin(), released_.end(), job) != released_.end();
  }
  std::vector<wire::TensorKey> received() {
    absl::MutexLock lock(&mu_);
    return received_;
  }
  // Waits until `n` tensors have arrived on the data links (they travel apart from the control
  // stream, so they may trail the StepDone).
  int64_t WaitReceived(size_t n) {
    absl::MutexLock lock(&mu_);
    wait_for_ = n;
    mu_.Await(absl::Condition(this, &FakeWorker::ReceivedEnough));
    return received_rows_;
  }
  // Waits until `n` data links were accepted or 10 s passed; returns how many were.
  size_t WaitLinks(size_t n) {
    absl::MutexLock lock(&mu_);
    links_wanted_ = n;
    mu_.AwaitWithTimeout(absl::Condition(this, &FakeWorker::LinksEnough), absl::Seconds(10));
    return links_.size();
  }
  // Waits (at most 10 s) until an OpenLinks arrived; returns "job@generation" of each, in order.
  std::vector<std::string> WaitOpenLinks() {
    absl::MutexLock lock(&mu_);
    auto any = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !open_links_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&any), absl::Seconds(10));
    return open_links_;
  }
  const std::string& name() const { return name_; }

 private:
  bool LinksEnough() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return links_.size() >= links_wanted_;
  }
  bool ReceivedEnough() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return received_.size() >= wait_for_;
  }

  // Writes the layer files of this worker's chunks into the SaveShards directory as a worker
  // does (with the freshly initialised weights: the fake trains nothing).
  absl::Status WriteShards(const v1::SaveShards& save) {
    v1::Assign a;
    {
      absl::MutexLock lock(&mu_);
      a = assign_;
    }
    PT_ASSIGN_OR_RETURN(testing::AssignedState state, testing::InitialStateOf(a));
    worker::StateUpload upload;
    upload.job = save.job();
    upload.generation = save.generation();
    upload.step = save.step();
    upload.worker = name_;
    upload.shards = std::move(state.shards);
    grpc::ClientContext context;
    return worker::PutState(stub_.get(), &context, upload, state.tensors).status();
  }

  void ReadLoop() {
    v1::WorkerCommand command;
    while (stream_->Read(&command)) {
      v1::WorkerEvent event;
      if (command.has_assign()) {
        const v1::Assign& a = command.assign();
        {
          absl::MutexLock lock(&mu_);
          assign_ = a;
          microbatches_ = a.microbatches();
          num_chunks_ = a.chunks_size();
        }
        event.mutable_assigned()->set_job(a.job());
        event.mutable_assigned()->set_generation(a.generation());
      } else if (command.has_run_step()) {
        const v1::RunStep& r = command.run_step();
        absl::MutexLock lock(&mu_);
        ++run_steps_;
        if (r.step() == hold_step_) {
          hold_step_ = -1;
          held_ = r;
          continue;
        }
        if (r.step() == fail_step_) {
          fail_step_ = -1;
          v1::WorkerError* e = event.mutable_error();
          e->set_job(r.job());
          e->set_generation(r.generation());
          e->set_step(r.step());
          e->set_code(static_cast<int>(fail_status_.code()));
          e->set_message(std::string(fail_status_.message()));
        } else {
          v1::StepDone* d = event.mutable_step_done();
          d->set_job(r.job());
          d->set_generation(r.generation());
          d->set_step(r.step());
          const int C = assign_.chunks_size();
          for (const v1::ChunkSpec& c : assign_.chunks()) {
            if (c.rank() != assign_.rank()) continue;
            if (c.chunk() == C - 1) {
              for (int mb = 0; mb < assign_.microbatches(); ++mb) {
                d->add_microbatch_losses(0.25f * (mb + 1));
              }
            }
            for (int64_t l = c.first_layer(); l < c.last_layer() && !omit_norms_; ++l) {
              v1::LayerNormSq* n = d->add_grad_norms();
              n->set_layer(l);
              n->set_norm_sq(static_cast<double>(l + 1));
            }
          }
          for (int p = 0; p < assign_.actions_size(); ++p) {
            v1::ActionTiming* t = d->add_timings();
            *t->mutable_action() = assign_.actions(p);
            t->set_start_us(10.0 * p);
            t->set_end_us(10.0 * p + 5);
          }
        }
      } else if (command.has_commit()) {
        bool refuse = false;
        {
          absl::MutexLock lock(&mu_);
          if (command.commit().step() == ignore_commit_step_) continue;
          clip_scales_.push_back(command.commit().clip_scale());
          refuse = command.commit().step() == refuse_commit_step_;
        }
        if (refuse) {
          v1::WorkerError* e = event.mutable_error();
          e->set_job(command.commit().job());
          e->set_generation(command.commit().generation());
          e->set_step(command.commit().step());
          e->set_code(static_cast<int>(absl::StatusCode::kFailedPrecondition));
          e->set_message("Commit refused by the test");
        } else {
          event.mutable_committed()->set_job(command.commit().job());
          event.mutable_committed()->set_generation(command.commit().generation());
          event.mutable_committed()->set_step(command.commit().step());
        }
      } else if (command.has_abort()) {
        absl::MutexLock lock(&mu_);
        ++aborts_;
        if (!held_.has_value()) continue;
        v1::WorkerError* e = event.mutable_error();
        e->set_job(held_->job());
        e->set_generation(held_->generation());
        e->set_step(held_->step());
        e->set_code(static_cast<int>(absl::StatusCode::kAborted));
        e->set_message("step aborted by the coordinator");
        held_.reset();
        if (hold_aborted_answer_) {
          hold_aborted_answer_ = false;
          aborted_answer_ = std::move(event);
          continue;
        }
      } else if (command.has_release()) {
        absl::MutexLock lock(&mu_);
        released_.push_back(command.release().job());
        continue;
      } else if (command.has_open_links()) {
        absl::MutexLock lock(&mu_);
        open_links_.push_back(
            absl::StrCat(command.open_links().job(), "@", command.open_links().generation()));
        continue;
      } else if (command.has_save_shards()) {
        bool skip = false;
        {
          absl::MutexLock lock(&mu_);
          if (ignore_save_) continue;
          skip = skip_uploads_;
        }
        if (!skip) {
          const absl::Status written = WriteShards(command.save_shards());
          EXPECT_TRUE(written.ok()) << written;
        }
        event.mutable_shards_saved()->set_job(command.save_shards().job());
        event.mutable_shards_saved()->set_generation(command.save_shards().generation());
        event.mutable_shards_saved()->set_step(command.save_shards().step());
      } else {
        continue;
      }
      absl::MutexLock lock(&write_mu_);
      if (!stream_->Write(event)) break;
    }
    const grpc::Status status = stream_->Finish();
    absl::MutexLock lock(&mu_);
    ended_ = true;
    end_status_ =
        absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  }

  const std::string name_;
  std::string address_;
  std::unique_ptr<link::ExchangeService> exchange_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerControl::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerEvent, v1::WorkerCommand>> stream_;
  std::thread reader_;
  std::atomic<bool> stopped_{false};

  // Protects everything the reader thread, the link callbacks and the test share.
  mutable absl::Mutex mu_;
  v1::Assign assign_ ABSL_GUARDED_BY(mu_);
  int microbatches_ ABSL_GUARDED_BY(mu_) = 1;
  int num_chunks_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t fail_step_ ABSL_GUARDED_BY(mu_) = -1;
  bool refuse_links_ ABSL_GUARDED_BY(mu_) = false;
  int run_steps_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t hold_step_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t ignore_commit_step_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t refuse_commit_step_ ABSL_GUARDED_BY(mu_) = -1;
  bool ignore_save_ ABSL_GUARDED_BY(mu_) = false;
  bool omit_norms_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<float> clip_scales_ ABSL_GUARDED_BY(mu_);
  bool skip_uploads_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<v1::RunStep> held_ ABSL_GUARDED_BY(mu_);
  bool hold_aborted_answer_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<v1::WorkerEvent> aborted_answer_ ABSL_GUARDED_BY(mu_);
  // Serialises the reader thread's writes with ReleaseAbortedAnswer's (one writer at a time).
  absl::Mutex write_mu_;
  absl::Status fail_status_ ABSL_GUARDED_BY(mu_);
  int aborts_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<wire::TensorKey> received_ ABSL_GUARDED_BY(mu_);
  size_t links_wanted_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t received_rows_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::unique_ptr<link::PeerLink>> links_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
  size_t wait_for_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> released_ ABSL_GUARDED_BY(mu_);    // jobs named by Release commands.
  std::vector<std::string> open_links_ ABSL_GUARDED_BY(mu_);  // "job@generation" of OpenLinks.
};

class CoordinatorServiceTest : public ::testing::Test {
 protected:
  // The service's options; fixtures for timing-dependent behaviour shorten them.
  virtual CoordinatorOptions Options() const {
    CoordinatorOptions options;
    options.checkpoint_root = "/";
    return options;
  }
  // The shell's transport options; the slow-disk fixture sets a write hook.
  virtual ServiceTransport Transport() { return ServiceTransport(); }

  void SetUp() override {
    service_ = std::make_unique<CoordinatorService>(Options(), Transport());
    grpc::ServerBuilder builder;
    introspection::AddHealthAndReflection(&builder);
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    AllowClientKeepalive(builder);
    service_->RegisterOn(builder);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = absl::StrCat("127.0.0.1:", port);
    absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Connect(address_);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }
  void TearDown() override {
    workers_.clear();
    service_->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_.reset();
    service_.reset();
  }

  // Streams `first` and then `second` to `job` on one Train stream (the second queued behind the
  // first) and returns the first failure among their answers (OK if both succeed).
  absl::Status FirstFailureOfTwo(const std::string& job, const TestBatch& first,
                                 const TestBatch& second) {
    absl::StatusOr<std::unique_ptr<client::TrainSession>> session = client_->StartTraining(job);
    if (!session.ok()) return session.status();
    client::TrainSession& s = **session;
    PT_RETURN_IF_ERROR(s.Send(first.view()));
    PT_RETURN_IF_ERROR(s.Send(second.view()));
    absl::Status failed;
    for (int i = 0; i < 2 && failed.ok(); ++i) failed = s.Receive().status();
    return failed;
  }

  // Starts `n` fake workers and waits until the coordinator lists them.
  void AddWorkers(int n) {
    for (int i = 0; i < n; ++i) {
      workers_.push_back(
          std::make_unique<FakeWorker>(address_, absl::StrCat("w", workers_.size())));
      ASSERT_TRUE(workers_.back()->WaitRegistered(*client_).ok());
    }
  }

  // A stub on a channel of its own, for calls the SDK does not make as a test needs them.
  std::unique_ptr<v1::WorkerControl::Stub> RawWorkerStub() const {
    return v1::WorkerControl::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }
  std::unique_ptr<v1::Coordinator::Stub> RawStub() const {
    return v1::Coordinator::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<client::Client> client_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
};

TEST_F(CoordinatorServiceTest, UnknownScheduleIsInvalidArgument) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 4, "pipedream"));
  ASSERT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(),
              HasSubstr(schedule::ParseScheduleKind("pipedream").status().message()));
}

TEST_F(CoordinatorServiceTest, InvalidScheduleParamsAreTheGeneratorsMessage) {
  AddWorkers(2);
  v1::JobSpec spec = MakeSpec(2, 3, "interleaved");
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(spec);
  ASSERT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  const absl::Status expected =
      schedule::CheckScheduleParams({schedule::ScheduleKind::kInterleaved, 2, 3, 2});
  ASSERT_FALSE(expected.ok());
  EXPECT_EQ(job.status().message(), absl::StrCat("CreateJob: ", expected.message()));
}

TEST_F(CoordinatorServiceTest, FewerWorkersThanStagesIsFailedPrecondition) {
  AddWorkers(1);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(3, 3));
  ASSERT_EQ(job.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(job.status().message(), "CreateJob: job needs 3 workers, 1 idle: 2 missing");
}

TEST_F(CoordinatorServiceTest, ModelWithFewerLayersThanChunksIsInvalidArgument) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 4, "zb-v"));
  ASSERT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(),
              HasSubstr("the model has 3 layers, fewer than the 4 chunks of 2 stages x 2 virtual "
                        "stages"));
}

TEST_F(CoordinatorServiceTest, BadModelIsInvalidArgument) {
  AddWorkers(1);
  v1::JobSpec spec = MakeSpec(1, 1);
  spec.mutable_model()->mutable_layers(2)->mutable_linear()->set_in_features(5);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorServiceTest, ModelSizesLeftZeroAreFilledFromTheDataShape) {
  AddWorkers(2);
  v1::JobSpec spec = MakeSpec(2, 2);
  spec.mutable_model()->set_input_features(0);
  spec.mutable_model()->mutable_layers(2)->mutable_linear()->set_out_features(0);
  spec.set_threads(0);  // documented: 1.
  // Without the data shape the sizes stay unknown: the error says where they would come from.
  absl::StatusOr<v1::JobStatus> unresolved = client_->CreateJob(spec);
  ASSERT_EQ(unresolved.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unresolved.status().message(), HasSubstr("JobSpec.data_shape"));
  // A data shape that contradicts a size the spec sets.
  v1::JobSpec contradicting = MakeSpec(2, 2);
  contradicting.mutable_data_shape()->set_input_features(5);
  absl::StatusOr<v1::JobStatus> bad = client_->CreateJob(contradicting);
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("model input_features 4 != data set's 5"));
  // The data shape fills them; the job runs the resolved spec, equal to the written-out one.
  spec.mutable_data_shape()->set_input_features(4);
  spec.mutable_data_shape()->set_target_features(1);
  spec.mutable_data_shape()->set_num_classes(3);
  spec.mutable_data_shape()->set_tokens_per_sample(1);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().model().SerializeAsString(), MakeSpec(2, 2).model().SerializeAsString());
  EXPECT_EQ(job->spec().threads(), 1);
  absl::StatusOr<v1::StepResult> r = client_->TrainStep(job->job(), MakeBatch(4).view());
  ASSERT_TRUE(r.ok()) << r.status();
}

TEST_F(CoordinatorServiceTest, DataShapeWithOtherTargetFeaturesIsInvalidArgument) {
  AddWorkers(1);
  v1::JobSpec spec = MakeSpec(1, 1);
  spec.mutable_data_shape()->set_target_features(3);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(spec);
  ASSERT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(),
              HasSubstr("the model's loss needs 1 target features per row, the data shape has 3"));
}

TEST_F(CoordinatorServiceTest, DuplicateWorkerNameIsRefused) {
  AddWorkers(1);
  FakeWorker twin(address_, "w0");
  const absl::Status ended = twin.WaitEnded();
  EXPECT_EQ(ended.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(ended.message(), HasSubstr("'w0'"));
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client_->ListWorkers();
  ASSERT_TRUE(workers.ok());
  EXPECT_EQ(workers->size(), 1u);
}

TEST_F(CoordinatorServiceTest, NewerIncarnationReplacesAHungWorkerOfTheSameName) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  // w1 restarts while its old process is still connected (say, hung): the restart wins.
  FakeWorker restarted(address_, "w1", /*incarnation=*/2);
  ASSERT_TRUE(restarted.WaitRegistered(*client_).ok());
  const absl::Status old_end = workers_[1]->WaitEnded();
  EXPECT_EQ(old_end.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(old_end.message(), HasSubstr("replaced by a newer incarnation"));
  absl::StatusOr<v1::JobStatus> status = client_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status->reason(), HasSubstr("worker 'w1' (rank 1) was lost"));
  // An older incarnation (a zombie reconnecting) is refused.
  FakeWorker zombie(address_, "w1", /*incarnation=*/1);
  EXPECT_EQ(zombie.WaitEnded().code(), absl::StatusCode::kAlreadyExists);
  // The restarted worker serves the next job.
  absl::StatusOr<v1::JobStatus> next = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(next.ok()) << next.status();
}

TEST_F(CoordinatorServiceTest, StepSumsLossesAndFeedsMicrobatches) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 4));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_READY);
  ASSERT_EQ(job->stages_size(), 2);
  const TestBatch batch = MakeBatch(8);
  absl::StatusOr<v1::StepResult> r = client_->TrainStep(job->job(), batch.view());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step(), 1);
  EXPECT_EQ(r->loss(), 0.25f + 0.5f + 0.75f + 1.0f);
  EXPECT_EQ(r->microbatch_losses_size(), 4);
  ASSERT_EQ(r->workers_size(), 2);
  EXPECT_GT(r->workers(0).busy_ms(), 0);
  EXPECT_GE(r->predicted_bubble_fraction(), 0);
  // Rank 0 got the 4 input micro-batches (2 rows each), rank 1 the 4 target micro-batches.
  EXPECT_EQ(workers_[0]->WaitReceived(4), 8);
  EXPECT_EQ(workers_[1]->WaitReceived(4), 8);
  for (const wire::TensorKey& k : workers_[0]->received()) {
    EXPECT_EQ(k.kind, wire::TensorKind::kInput);
    EXPECT_EQ(k.chunk, 0);
    EXPECT_EQ(k.step, 1);  // steps are numbered from 1.
  }
  for (const wire::TensorKey& k : workers_[1]->received()) {
    EXPECT_EQ(k.kind, wire::TensorKind::kTarget);
    EXPECT_EQ(k.chunk, 1);
  }
  absl::StatusOr<v1::JobStatus> status = client_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->steps_done(), 1);
}

// The gradient norms are the clip scale's input: a job that clips needs every layer's (and gets
// a scale below 1 from the fake's large norms); one that does not commits with 1 and needs none.
TEST_F(CoordinatorServiceTest, GradientNormsAreRequiredExactlyWhenTheJobClips) {
  AddWorkers(2);
  v1::JobSpec spec = MakeSpec(2, 2);
  spec.mutable_optimizer()->set_clip_norm(0.5f);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::StepResult> r = client_->TrainStep(job->job(), MakeBatch(4).view());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(workers_[0]->clip_scales().size(), 1u);
  EXPECT_LT(workers_[0]->clip_scales()[0], 1.0f);
  workers_[1]->OmitNorms();
  r = client_->TrainStep(job->job(), MakeBatch(4).view());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(r.status().message(), HasSubstr("no worker reported the gradient norm of layer"));
  ASSERT_TRUE(client_->CancelJob(job->job()).ok());
}

TEST_F(CoordinatorServiceTest, AJobWithoutClippingNeedsNoGradientNorms) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  for (auto& w : workers_) w->OmitNorms();
  for (int step = 1; step <= 2; ++step) {
    absl::StatusOr<v1::StepResult> r = client_->TrainStep(job->job(), MakeBatch(4).view());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step(), step);
  }
  EXPECT_EQ(workers_[0]->clip_scales(), std::vector<float>({1.0f, 1.0f}));
}

TEST_F(CoordinatorServiceTest, FeedLinksAreOpenWhenTheJobIsReadyAndKeptForItsSteps) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 4));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::JOB_STATE_READY);
  // Before any step: the coordinator dialled the first chunk's owner (inputs) and the last
  // chunk's owner (targets), so the first step does not wait for the handshakes.
  EXPECT_EQ(workers_[0]->WaitLinks(1), 1u);
  EXPECT_EQ(workers_[1]->WaitLinks(1), 1u);
  EXPECT_TRUE(workers_[0]->received().empty());
  // And every rank was told to dial its neighbours (once all had accepted generation 1).
  const std::string opened = absl::StrCat(job->job(), "@1");
  EXPECT_THAT(workers_[0]->WaitOpenLinks(), ::testing::ElementsAre(opened));
  EXPECT_THAT(workers_[1]->WaitOpenLinks(), ::testing::ElementsAre(opened));
  const TestBatch batch = MakeBatch(8);
  for (int step = 1; step <= 2; ++step) {
    absl::StatusOr<v1::StepResult> r = client_->TrainStep(job->job(), batch.view());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step(), step);
  }
  // Both steps were fed over those links: no second dial.
  EXPECT_EQ(workers_[0]->WaitReceived(8), 16);
  EXPECT_EQ(workers_[1]->WaitReceived(8), 16);
  EXPECT_EQ(workers_[0]->WaitLinks(1), 1u);
  EXPECT_EQ(workers_[1]->WaitLinks(1), 1u);
}

TEST_F(CoordinatorServiceTest, BadBatchesLeaveTheJobUsable) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job();

  // Wrong feature count.
  TestBatch wrong_features = MakeBatch(4, 5);
  EXPECT_EQ(client_->TrainStep(id, wrong_features.view()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Label out of range.
  TestBatch bad_label = MakeBatch(4);
  bad_label.targets(1, 0) = 7;
  EXPECT_EQ(client_->TrainStep(id, bad_label.view()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Not divisible by M.
  TestBatch odd = MakeBatch(3);
  absl::Status s = client_->TrainStep(id, odd.view()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("not divisible by the job's 2 micro-batches"));
  // Non-finite input.
  TestBatch nan = MakeBatch(4);
  nan.inputs(2, 3) = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(client_->TrainStep(id, nan.view()).status().code(), absl::StatusCode::kInvalidArgument);
  // More samples than rows.
  TestBatch overcount = MakeBatch(4);
  overcount.samples = int64_t{1} << 62;
  EXPECT_EQ(client_->TrainStep(id, overcount.view()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A dtype other than float32.
  {
    TestBatch b = MakeBatch(4);
    v1::TrainRequest request = client::MakeTrainRequest(id, b.view());
    EXPECT_EQ(request.inputs().dtype(), v1::DTYPE_F32);
    request.mutable_targets()->set_dtype(static_cast<v1::DType>(7));
    absl::StatusOr<std::unique_ptr<client::TrainSession>> session = client_->StartTraining(id);
    ASSERT_TRUE(session.ok()) << session.status();
    absl::Status d = (*session)->Step(request).status();
    EXPECT_EQ(d.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(d.message(), HasSubstr("targets: dtype 7 is not supported"));
  }
  // Unknown job.
  EXPECT_EQ(client_->TrainStep("job-404", MakeBatch(4).view()).status().code(),
            absl::StatusCode::kNotFound);
  // Nothing reached the workers, and the job still trains.
  EXPECT_EQ(workers_[0]->aborts(), 0);
  absl::StatusOr<v1::StepResult> r = client_->TrainStep(id, MakeBatch(4).view());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step(), 1);
}

TEST_F(CoordinatorServiceTest, SecondTrainStreamIsRefusedAndFirstContinues) {
  AddWorkers(1);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(1, 1));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<std::unique_ptr<client::TrainSession>> first = client_->StartTraining(job->job());
  ASSERT_TRUE(first.ok());
  const TestBatch batch = MakeBatch(2);
  ASSERT_TRUE((*first)->Step(batch.view()).ok());

  absl::StatusOr<v1::StepResult> second = client_->TrainStep(job->job(), batch.view());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("already has an active Train stream"));

  absl::StatusOr<v1::StepResult> again = (*first)->Step(batch.view());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->step(), 2);
  EXPECT_TRUE((*first)->Finish().ok());
  // Once the first stream is over, a new one may train.
  absl::StatusOr<v1::StepResult> third = client_->TrainStep(job->job(), batch.view());
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->step(), 3);
}

TEST_F(CoordinatorServiceTest, BatchesSentAheadAreTrainedInOrder) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<std::unique_ptr<client::TrainSession>> session =
      client_->StartTraining(job->job());
  ASSERT_TRUE(session.ok()) << session.status();
  client::TrainSession& s = **session;
  EXPECT_EQ(s.Receive().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(s.Send(MakeBatch(4).view()).ok());
  ASSERT_TRUE(s.Send(MakeBatch(6).view()).ok());
  EXPECT_EQ(s.in_flight(), 2);
  // Two unanswered is the limit, and Step waits for nothing it did not send.
  absl::Status third = s.Send(MakeBatch(4).view());
  EXPECT_EQ(third.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(third.message(), HasSubstr("Receive one before sending another"));
  EXPECT_EQ(s.Step(MakeBatch(4).view()).status().code(), absl::StatusCode::kFailedPrecondition);
  for (int step = 1; step <= 4; ++step) {
    absl::StatusOr<v1::StepResult> r = s.Receive();
    ASSERT_TRUE(r.ok()) << "step " << step << ": " << r.status();
    EXPECT_EQ(r->step(), step);
    if (step <= 2) {
      ASSERT_TRUE(s.Send(MakeBatch(step == 1 ? 8 : 2).view()).ok());
    }
  }
  EXPECT_EQ(s.in_flight(), 0);
  ASSERT_TRUE(s.Finish().ok());
  // Rank 0 got every batch's inputs in the order sent: 4, 6, 8 and 2 rows over 2 micro-batches.
  EXPECT_EQ(workers_[0]->WaitReceived(8), 20);
  std::vector<int64_t> steps;
  for (const wire::TensorKey& k : workers_[0]->received()) steps.push_back(k.step);
  EXPECT_THAT(steps, ::testing::ElementsAre(1, 1, 2, 2, 3, 3, 4, 4));
  absl::StatusOr<v1::JobStatus> status = client_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->steps_done(), 4);
}

// A step with the next batch queued behind it returns once its Commit is sent, and the next
// step confirms it after sending its own RunStep (so the workers start it without waiting for a
// round trip). A rank that refuses the Commit fails the job either way — the step's own answer
// if nothing was queued yet, the next one's otherwise — naming the step and the rank.
TEST_F(CoordinatorServiceTest, ACommitRefusedWhileTheNextBatchWaitsFailsTheJob) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  workers_[1]->RefuseCommit(1);
  const absl::Status failed = FirstFailureOfTwo(job->job(), MakeBatch(4), MakeBatch(4));
  EXPECT_EQ(failed.code(), absl::StatusCode::kFailedPrecondition) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("worker 'w1' (rank 1), step 1: Commit refused"));
  absl::StatusOr<v1::JobStatus> status = client_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status->reason(), HasSubstr("step 1 was not committed everywhere"));
}

// A batch refused before it runs (not divisible into its micro-batches) confirms the Commit the
// step before left to it (or step 1 confirmed it itself, if the bad batch was not queued yet):
// the refusal fails the job either way, and no checkpoint of unequal replicas can follow.
// (DoCheckpoint also confirms an unconfirmed Commit first, for a checkpoint queued between two
// steps of a stream; no test here can order the job's operations so.)
TEST_F(CoordinatorServiceTest, ACommitRefusedBeforeABadBatchFailsTheJobAndNoCheckpointFollows) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  workers_[0]->RefuseCommit(1);
  EXPECT_FALSE(FirstFailureOfTwo(job->job(), MakeBatch(4), MakeBatch(3)).ok());
  char dir[] = "/tmp/coordinator_confirm_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  absl::StatusOr<v1::CheckpointResponse> saved = client_->Checkpoint(job->job(), dir);
  EXPECT_FALSE(saved.ok());
  absl::StatusOr<model::CheckpointManifest> m = model::ReadCheckpointManifest(dir);
  EXPECT_FALSE(m.ok()) << "a checkpoint was published";
  absl::StatusOr<v1::JobStatus> status = client_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status->reason(), HasSubstr("step 1 was not committed everywhere"));
  std::filesystem::remove_all(dir);
}

TEST_F(CoordinatorServiceTest, AFailedStepDropsTheBatchSentBehindIt) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  workers_[1]->FailStep(1, absl::ResourceExhaustedError("out of memory in F(mb=0, chunk=1)"));
  absl::StatusOr<std::unique_ptr<client::TrainSession>> session =
      client_->StartTraining(job->job());
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE((*session)->Send(MakeBatch(4).view()).ok());
  ASSERT_TRUE((*session)->Send(MakeBatch(4).view()).ok());
  absl::StatusOr<v1::StepResult> r = (*session)->Receive();
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_EQ((*session)->in_flight(), 0);
  EXPECT_EQ((*session)->Receive().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*session)->Finish().code(), absl::StatusCode::kResourceExhausted);
  // The stream ended after the queued batch was skipped: it was applied nowhere.
  absl::StatusOr<v1::JobStatus> status = client_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), v1::JOB_STATE_READY);
  EXPECT_EQ(status->steps_done(), 0);
  absl::StatusOr<v1::StepResult> again = client_->TrainStep(job->job(), MakeBatch(4).view());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->step(), 1);
}

TEST_F(CoordinatorServiceTest, AStreamClosedWithBatchesInFlightAnswersThemAll) {
  AddWorkers(1);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(1, 1));
  ASSERT_TRUE(job.ok()) << job.status();
  // A raw stream: two batches and the end of writes before any result is read.
  auto stub = RawStub();
  grpc::ClientContext context;
  auto stream = stub->Train(&context);
  const TestBatch batch = MakeBatch(2);
  ASSERT_TRUE(stream->Write(client::MakeTrainRequest(job->job(), batch.view())));
  ASSERT_TRUE(stream->Write(client::MakeTrainRequest(job->job(), batch.view())));
  ASSERT_TRUE(stream->WritesDone());
  v1::StepResult result;
  ASSERT_TRUE(stream->Read(&result));
  EXPECT_EQ(result.step(), 1);
  ASSERT_TRUE(stream->Read(&result));
  EXPECT_EQ(result.step(), 2);
  EXPECT_FALSE(stream->Read(&result));
  const grpc::Status finished = stream->Finish();
  EXPECT_TRUE(finished.ok()) << finished.error_message();
  // The SDK's Finish receives what is in flight.
  absl::StatusOr<std::unique_ptr<client::TrainSession>> session =
      client_->StartTraining(job->job());
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE((*session)->Send(batch.view()).ok());
  ASSERT_TRUE((*session)->Send(batch.view()).ok());
  ASSERT_TRUE((*session)->Finish().ok());
  absl::StatusOr<v1::JobStatus> status = client_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->steps_done(), 4);
}

TEST_F(CoordinatorServiceTest, WorkerErrorAbortsTheStepAndTheJobStaysReady) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  workers_[1]->FailStep(1, absl::ResourceExhaustedError("out of memory in F(mb=0, chunk=1)"));
  // Worker 0 is still running step 1 and answers it (ABORTED) only after the Abort, possibly
  // after the retry of step 1 began: that late answer must not fail the retry.
  workers_[0]->HoldStepUntilAbort(1);
  absl::StatusOr<v1::StepResult> r = client_->TrainStep(job->job(), MakeBatch(4).view());
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("worker 'w1' (rank 1), step 1: out of memory"));
  absl::StatusOr<v1::JobStatus> status = client_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), v1::JOB_STATE_READY);
  EXPECT_EQ(status->steps_done(), 0);
  r = client_->TrainStep(job->job(), MakeBatch(4).view());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step(), 1);
  EXPECT_EQ(workers_[0]->aborts(), 1);
}

// The batch is fed before RunStep. A rank whose data link is refused fails the step, and every
// rank still hears RunStep and then Abort, so one holding part of the inputs drops them with its
// aborted run (a retry of the step must not meet them as duplicates); the job stays usable.
TEST_F(CoordinatorServiceTest, ARefusedDataLinkAbortsTheStepOnEveryRank) {
  AddWorkers(2);
  workers_[0]->RefuseLinks();
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  // As real workers do without their inputs: no answer until the Abort.
  workers_[0]->HoldStepUntilAbort(1);
  workers_[1]->HoldStepUntilAbort(1);
  absl::StatusOr<v1::StepResult> r = client_->TrainStep(job->job(), MakeBatch(4).view());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("data link to rank 0"));
  EXPECT_THAT(r.status().message(), HasSubstr("data links refused by the test"));
  absl::StatusOr<v1::JobStatus> status = client_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), v1::JOB_STATE_READY) << status->reason();
  EXPECT_EQ(status->steps_done(), 0);
  // Commands on one stream arrive in order: the Abort follows the RunStep on each rank.
  for (const auto& w : workers_) {
    EXPECT_EQ(w->WaitAborts(1), 1) << w->name();
    EXPECT_EQ(w->run_steps(), 1) << w->name();
  }
}

// A checkpoint whose uploads are stuck on a slow disk: the uploads' I/O runs on the shell's I/O
// threads, so another job keeps training and the health service keeps answering meanwhile.
class SlowDiskTest : public CoordinatorServiceTest {
 protected:
  ServiceTransport Transport() override {
    ServiceTransport transport;
    transport.before_state_write = [this](const std::string&) {
      absl::MutexLock lock(&disk_mu_);
      ++stalled_writes_;
      disk_mu_.Await(absl::Condition(&disk_released_));
    };
    return transport;
  }
  void TearDown() override {
    ReleaseDisk();
    CoordinatorServiceTest::TearDown();
  }
  void ReleaseDisk() {
    absl::MutexLock lock(&disk_mu_);
    disk_released_ = true;
  }

  absl::Mutex disk_mu_;
  int stalled_writes_ ABSL_GUARDED_BY(disk_mu_) = 0;
  bool disk_released_ ABSL_GUARDED_BY(disk_mu_) = false;
};

TEST_F(SlowDiskTest, AStalledUploadDelaysNeitherAnotherJobsStepsNorAHealthCheck) {
  AddWorkers(4);
  absl::StatusOr<v1::JobStatus> saving = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(saving.ok()) << saving.status();
  absl::StatusOr<v1::JobStatus> training = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(training.ok()) << training.status();
  const std::string dir = ::testing::TempDir() + "slow_disk_ck";
  std::filesystem::remove_all(dir);
  absl::Status saved = absl::UnknownError("not run");
  std::thread saver([&] { saved = client_->Checkpoint(saving->job(), dir).status(); });
  {
    auto stalled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(disk_mu_) { return stalled_writes_ > 0; };
    absl::MutexLock lock(&disk_mu_);
    ASSERT_TRUE(disk_mu_.AwaitWithTimeout(absl::Condition(&stalled), absl::Seconds(30)));
  }
  // The disk holds the upload; the other job trains and the health service answers.
  for (int step = 1; step <= 3; ++step) {
    absl::StatusOr<v1::StepResult> r = client_->TrainStep(training->job(), MakeBatch(4).view());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step(), step);
  }
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status checked = health->Check(&context, request, &response);
  EXPECT_TRUE(checked.ok()) << checked.error_message();
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  {
    absl::MutexLock lock(&disk_mu_);
    EXPECT_FALSE(disk_released_);  // the upload was stalled all along.
  }
  ReleaseDisk();
  saver.join();
  EXPECT_TRUE(saved.ok()) << saved;
  EXPECT_TRUE(model::VerifyCheckpoint(dir).ok());
  std::filesystem::remove_all(dir);
}

TEST_F(CoordinatorServiceTest, LostWorkerFailsTheJob) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  workers_[1]->Stop();
  // The loss is noticed asynchronously (a step may first fail on the broken data link, which
  // leaves the job ready); keep training until the broken Join stream has failed the job.
  for (;;) {
    absl::StatusOr<v1::JobStatus> now = client_->GetJob(job->job());
    ASSERT_TRUE(now.ok());
    if (now->state() == v1::JOB_STATE_FAILED) break;
    client_->TrainStep(job->job(), MakeBatch(4).view()).IgnoreError();
  }
  absl::StatusOr<v1::JobStatus> status;
  status = client_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status->reason(), HasSubstr("worker 'w1' (rank 1) was lost"));
  absl::StatusOr<v1::StepResult> r = client_->TrainStep(job->job(), MakeBatch(4).view());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  // The surviving worker is idle again.
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client_->ListWorkers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].job(), "");
}

TEST_F(CoordinatorServiceTest, BadOptimizerIsInvalidArgument) {
  AddWorkers(1);
  v1::JobSpec spec = MakeSpec(1, 1);
  spec.mutable_optimizer()->clear_kind();
  EXPECT_EQ(client_->CreateJob(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec = MakeSpec(1, 1);
  spec.mutable_optimizer()->mutable_sgd()->set_lr(-1);
  EXPECT_EQ(client_->CreateJob(spec).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorServiceTest, CheckpointWaitsForShardsThenWritesTheManifest) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(client_->TrainStep(job->job(), MakeBatch(4).view()).ok());
  char tmpl[] = "/tmp/coordinator_ckpt_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  absl::StatusOr<v1::CheckpointResponse> saved = client_->Checkpoint(job->job(), tmpl);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->step(), 1);
  absl::StatusOr<model::CheckpointManifest> m = model::ReadCheckpointManifest(tmpl);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->step, 1);
  EXPECT_EQ(m->microbatches, 2);
  EXPECT_EQ(m->seed, 1u);
  absl::StatusOr<math::OptimizerConfig> optimizer =
      model::OptimizerFromProto(MakeSpec(2, 2).optimizer());
  ASSERT_TRUE(optimizer.ok());
  EXPECT_EQ(m->optimizer, math::FormatOptimizerConfig(*optimizer));
  EXPECT_EQ(m->shards.size(), 2u);  // the two linear layers.
  // The workers' files, published with their digests.
  EXPECT_TRUE(model::LoadCheckpoint(tmpl).ok());
  std::system(absl::StrCat("rm -rf '", tmpl, "'").c_str());
  EXPECT_EQ(client_->Checkpoint("job-404", "/tmp/x").status().code(), absl::StatusCode::kNotFound);
}

// Issue 14: a worker that answers ShardsSaved without uploading its files (PutState) is not
// believed: the checkpoint fails naming a missing file, and no manifest is published.
TEST_F(CoordinatorServiceTest, ShardsSavedWithoutTheUploadFailsTheCheckpoint) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(client_->TrainStep(job->job(), MakeBatch(4).view()).ok());
  workers_[1]->SkipUploads();
  char tmpl[] = "/tmp/coordinator_rogue_ckpt_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = absl::StrCat(tmpl, "/ckpt");
  const absl::Status saved = client_->Checkpoint(job->job(), dir).status();
  EXPECT_EQ(saved.code(), absl::StatusCode::kNotFound) << saved;
  EXPECT_THAT(saved.message(), HasSubstr("layer-00002.safetensors"));  // rank 1's linear layer
  struct stat st;
  EXPECT_NE(stat(dir.c_str(), &st), 0) << "a checkpoint was published";
  EXPECT_NE(stat(absl::StrCat(dir, "/manifest.json").c_str(), &st), 0);
  // The job is still usable: the next step trains.
  EXPECT_TRUE(client_->TrainStep(job->job(), MakeBatch(4).view()).ok());
  std::system(absl::StrCat("rm -rf '", tmpl, "'").c_str());
}

TEST_F(CoordinatorServiceTest, GetJobOfUnknownJobIsNotFound) {
  EXPECT_EQ(client_->GetJob("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorServiceTest, PutStateTakesFilesOnlyFromTheJobsWorkersForACheckpointInProgress) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  auto stub = RawWorkerStub();
  auto upload = [&](const std::string& job_id, int64_t generation, const std::string& worker) {
    worker::StateUpload u;
    u.job = job_id;
    u.generation = generation;
    u.step = 0;
    u.worker = worker;
    grpc::ClientContext context;
    return worker::PutState(stub.get(), &context, u, {}).status();
  };
  EXPECT_EQ(upload("no-such-job", 1, "w0").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(upload(job->job(), 0, "w0").code(), absl::StatusCode::kAborted);
  const absl::Status stranger = upload(job->job(), 1, "w9");
  EXPECT_EQ(stranger.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(stranger.message(), HasSubstr("'w9' holds no rank"));
  const absl::Status idle = upload(job->job(), 1, "w0");
  EXPECT_EQ(idle.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(idle.message(), HasSubstr("no checkpoint of step 0 in progress"));
}

// ------------------------------------------------------------------ job life cycle

// Polls ListJobs (which, unlike GetJob, does not renew a job's client lease) until `job` is in
// `state` or has left the list (nullopt), for at most 30 s.
std::optional<v1::JobStatus> AwaitListedState(client::Client& client, const std::string& job,
                                              v1::JobState state) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  std::optional<v1::JobStatus> last;
  while (absl::Now() < deadline) {
    absl::StatusOr<std::vector<v1::JobStatus>> jobs = client.ListJobs();
    if (!jobs.ok()) return std::nullopt;
    last.reset();
    for (const v1::JobStatus& j : *jobs) {
      if (j.job() == job) last = j;
    }
    if (!last.has_value() || last->state() == state) return last;
    absl::SleepFor(absl::Milliseconds(5));  // polling interval, not synchronisation.
  }
  return last;
}

TEST_F(CoordinatorServiceTest, FinishedJobReleasesItsWorkersForTheNextJob) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_THAT(job->job(), ::testing::MatchesRegex("job-[0-9a-f]{8}-1"));
  ASSERT_TRUE(client_->TrainStep(job->job(), MakeBatch(4).view()).ok());
  absl::StatusOr<v1::JobStatus> done = client_->FinishJob(job->job());
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_DONE);
  EXPECT_EQ(done->steps_done(), 1);
  EXPECT_GT(done->ended_unix_ms(), 0);
  for (auto& w : workers_) EXPECT_TRUE(w->WaitReleased(job->job())) << w->name();
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client_->ListWorkers();
  ASSERT_TRUE(workers.ok());
  for (const v1::WorkerInfo& w : *workers) EXPECT_EQ(w.job(), "") << w.name();

  // The ended job takes no more work; finishing it again says what it is; cancelling is a no-op.
  absl::StatusOr<v1::StepResult> r = client_->TrainStep(job->job(), MakeBatch(4).view());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("is done"));
  EXPECT_EQ(client_->FinishJob(job->job()).status().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<v1::JobStatus> cancelled = client_->CancelJob(job->job());
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_DONE);
  EXPECT_EQ(client_->CancelJob("no-such-job").status().code(), absl::StatusCode::kNotFound);

  // The same workers serve the next job.
  absl::StatusOr<v1::JobStatus> next = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_NE(next->job(), job->job());
  r = client_->TrainStep(next->job(), MakeBatch(4).view());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step(), 1);
  absl::StatusOr<std::vector<v1::JobStatus>> jobs = client_->ListJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].job(), job->job());
  EXPECT_EQ((*jobs)[0].state(), v1::JOB_STATE_DONE);
  EXPECT_EQ((*jobs)[1].state(), v1::JOB_STATE_READY);
}

TEST_F(CoordinatorServiceTest, CancelAbortsTheStepInFlightAndFreesTheWorkers) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  workers_[1]->HoldStepUntilAbort(1);
  absl::StatusOr<v1::StepResult> step;
  std::thread trainer([&] { step = client_->TrainStep(job->job(), MakeBatch(4).view()); });
  std::optional<v1::JobStatus> training =
      AwaitListedState(*client_, job->job(), v1::JOB_STATE_TRAINING);
  ASSERT_TRUE(training.has_value());
  ASSERT_EQ(training->state(), v1::JOB_STATE_TRAINING);
  EXPECT_EQ(client_->FinishJob(job->job()).status().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<v1::JobStatus> cancelled = client_->CancelJob(job->job(), "operator says stop");
  trainer.join();
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(cancelled->reason(), "operator says stop");
  EXPECT_EQ(step.status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(step.status().message(), HasSubstr("operator says stop"));
  for (auto& w : workers_) EXPECT_TRUE(w->WaitReleased(job->job())) << w->name();
  // The Abort went out before the Release on the same stream.
  EXPECT_EQ(workers_[0]->aborts(), 1);
  absl::StatusOr<v1::JobStatus> status = client_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(status->steps_done(), 0);
  ASSERT_TRUE(client_->CreateJob(MakeSpec(2, 2)).ok());
}

TEST_F(CoordinatorServiceTest, JobsOnDifferentWorkersDoNotWaitForEachOther) {
  AddWorkers(4);
  absl::StatusOr<v1::JobStatus> a = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->stages(1).worker(), "w1");
  workers_[1]->HoldStepUntilAbort(1);
  absl::StatusOr<v1::StepResult> held;
  std::thread trainer([&] { held = client_->TrainStep(a->job(), MakeBatch(4).view()); });
  ASSERT_EQ(AwaitListedState(*client_, a->job(), v1::JOB_STATE_TRAINING)->state(),
            v1::JOB_STATE_TRAINING);
  // While job a's step hangs, job b is created and trains on the other two workers.
  absl::StatusOr<v1::JobStatus> b = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->stages(0).worker(), "w2");
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<v1::StepResult> r = client_->TrainStep(b->job(), MakeBatch(4).view());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step(), i + 1);
  }
  ASSERT_TRUE(client_->CancelJob(a->job()).ok());
  trainer.join();
  EXPECT_EQ(held.status().code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(client_->FinishJob(b->job()).ok());
}

TEST_F(CoordinatorServiceTest, AStreamCancelledWithBatchesInFlightLeavesTheJobUsable) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  auto stub = RawStub();
  for (int round = 0; round < 5; ++round) {
    grpc::ClientContext context;
    auto stream = stub->Train(&context);
    const TestBatch batch = MakeBatch(4);
    // A write may find the stream ended already: the coordinator refuses its claim while the
    // cancelled stream of an earlier round still holds the job (which of the two comes first,
    // the refusal or this write, is the scheduler's choice).
    if (stream->Write(client::MakeTrainRequest(job->job(), batch.view()))) {
      stream->Write(client::MakeTrainRequest(job->job(), batch.view()));
    }
    context.TryCancel();
    EXPECT_THAT(
        stream->Finish().error_code(),
        ::testing::AnyOf(grpc::StatusCode::CANCELLED, grpc::StatusCode::FAILED_PRECONDITION));
  }
  // Whatever ran of those batches ran whole: a new stream trains the next step (once the
  // cancelled streams released the job), and its number is the job's count.
  absl::StatusOr<v1::StepResult> r = absl::UnknownError("not run");
  for (int i = 0; i < 500; ++i) {
    r = client_->TrainStep(job->job(), MakeBatch(4).view());
    if (r.ok() || !absl::IsFailedPrecondition(r.status())) break;
    absl::SleepFor(absl::Milliseconds(10));  // polling a bounded wait for the claims' release.
  }
  ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<v1::JobStatus> status = client_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(r->step(), status->steps_done());
  EXPECT_LE(status->steps_done(), 11);
  EXPECT_EQ(status->state(), v1::JOB_STATE_READY);
}

class CoordinatorLeaseTest : public CoordinatorServiceTest {
 protected:
  CoordinatorOptions Options() const override {
    CoordinatorOptions options;
    options.client_lease = absl::Milliseconds(300);
    options.housekeeping_interval = absl::Milliseconds(10);
    return options;
  }
};

TEST_F(CoordinatorLeaseTest, JobWithoutAClientIsCancelledAndFreesItsWorkers) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  // A Train stream holds the lease for as long as it is open...
  {
    absl::StatusOr<std::unique_ptr<client::TrainSession>> session =
        client_->StartTraining(job->job());
    ASSERT_TRUE(session.ok());
    ASSERT_TRUE((*session)->Step(MakeBatch(4).view()).ok());
    absl::StatusOr<v1::JobStatus> attached = client_->GetJob(job->job());
    ASSERT_TRUE(attached.ok());
    EXPECT_TRUE(attached->client_attached());
    ASSERT_TRUE((*session)->Finish().ok());
  }
  // ... and once it is gone, nobody renews it.
  std::optional<v1::JobStatus> ended =
      AwaitListedState(*client_, job->job(), v1::JOB_STATE_CANCELLED);
  ASSERT_TRUE(ended.has_value());
  ASSERT_EQ(ended->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_THAT(ended->reason(), HasSubstr("client gone"));
  EXPECT_EQ(ended->steps_done(), 1);
  for (auto& w : workers_) EXPECT_TRUE(w->WaitReleased(job->job())) << w->name();
  absl::StatusOr<v1::StepResult> r = client_->TrainStep(job->job(), MakeBatch(4).view());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("client gone"));
}

class CoordinatorRetentionTest : public CoordinatorServiceTest {
 protected:
  CoordinatorOptions Options() const override {
    CoordinatorOptions options;
    options.job_retention = absl::ZeroDuration();
    options.housekeeping_interval = absl::Milliseconds(10);
    return options;
  }
};

TEST_F(CoordinatorRetentionTest, EndedJobsArePrunedAfterTheRetentionPeriod) {
  AddWorkers(1);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(1, 1));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(client_->FinishJob(job->job()).ok());
  EXPECT_FALSE(AwaitListedState(*client_, job->job(), v1::JOB_STATE_UNSPECIFIED).has_value());
  EXPECT_EQ(client_->GetJob(job->job()).status().code(), absl::StatusCode::kNotFound);
}

class CoordinatorDeadlineTest : public CoordinatorServiceTest {
 protected:
  CoordinatorOptions Options() const override {
    CoordinatorOptions options;
    // The test model's step is predicted in microseconds: the floor decides.
    options.step_deadline_floor = absl::Milliseconds(400);
    options.checkpoint_root = "/";
    options.wait_report_interval = absl::Milliseconds(100);
    options.log = [this](logging::LogLevel, const std::string& line) {
      absl::MutexLock lock(&log_mu_);
      log_.push_back(line);
    };
    return options;
  }

  std::vector<std::string> Log() {
    absl::MutexLock lock(&log_mu_);
    return log_;
  }
  // Waits (at most 10 s) until a logged line contains `text`; whether one did.
  bool WaitLogged(const std::string& text) {
    absl::MutexLock lock(&log_mu_);
    auto logged = [this, &text]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(log_mu_) {
      for (const std::string& line : log_) {
        if (line.find(text) != std::string::npos) return true;
      }
      return false;
    };
    return log_mu_.AwaitWithTimeout(absl::Condition(&logged), absl::Seconds(10));
  }

  mutable absl::Mutex log_mu_;
  mutable std::vector<std::string> log_ ABSL_GUARDED_BY(log_mu_);
};

TEST_F(CoordinatorDeadlineTest, AStuckWorkerMissesTheStepDeadlineAndIsNamed) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  workers_[1]->HoldStepUntilAbort(1);
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::StepResult> r = client_->TrainStep(job->job(), MakeBatch(4).view());
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("StepDone of step 1 from worker 'w1' (rank 1)"));
  EXPECT_GE(took, absl::Milliseconds(400));
  EXPECT_LT(took, absl::Seconds(20));
  bool reported = false;
  for (const std::string& line : Log()) {
    reported = reported ||
               (line.find("step 1: waiting for worker 'w1' (rank 1) for") != std::string::npos &&
                line.find("worker 'w0'") == std::string::npos);
  }
  EXPECT_TRUE(reported) << "no progress line names the missing rank";
  // The step was aborted everywhere; the job is usable again and the worker's late answer to
  // the aborted attempt does not disturb the retry.
  absl::StatusOr<v1::JobStatus> status = client_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), v1::JOB_STATE_READY);
  r = client_->TrainStep(job->job(), MakeBatch(4).view());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step(), 1);
}

// A retry's batch waits until every rank answered the aborted attempt: a rank answers only after
// it reset its mailbox, and inputs reaching it before would be dropped with the aborted run.
TEST_F(CoordinatorDeadlineTest, ARetryWaitsForTheAbortedAttemptsAnswersBeforeItsBatch) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  workers_[1]->FailStep(1, absl::ResourceExhaustedError("out of memory in F(mb=0, chunk=1)"));
  workers_[0]->HoldStepUntilAbort(1);
  workers_[0]->HoldAbortedAnswer();
  absl::StatusOr<v1::StepResult> r = client_->TrainStep(job->job(), MakeBatch(4).view());
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  ASSERT_EQ(workers_[0]->WaitReceived(2), 4);  // the first attempt's two input micro-batches.
  absl::StatusOr<v1::StepResult> retry;
  std::thread client([&] { retry = client_->TrainStep(job->job(), MakeBatch(4).view()); });
  EXPECT_TRUE(WaitLogged("waiting for worker 'w0' (rank 0) to answer an aborted step"));
  // The coordinator is waiting, before the feed: nothing of the retry has gone out.
  EXPECT_EQ(workers_[0]->received().size(), 2u);
  EXPECT_EQ(workers_[0]->run_steps(), 1);
  workers_[0]->ReleaseAbortedAnswer();
  client.join();
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->step(), 1);
  EXPECT_EQ(workers_[0]->WaitReceived(4), 8);
  EXPECT_EQ(workers_[0]->run_steps(), 2);
}

// Saving a checkpoint has a deadline too (the step deadline's floor, or longer for a large
// model): a rank that does not answer SaveShards is named, the checkpoint fails without a
// manifest, and the job stays usable — instead of waiting for the 30-minute step_timeout.
TEST_F(CoordinatorDeadlineTest, AWorkerThatDoesNotSaveMissesTheCheckpointDeadline) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(client_->TrainStep(job->job(), MakeBatch(4).view()).ok());
  workers_[1]->IgnoreSaveShards();
  char dir[] = "/tmp/coordinator_save_deadline_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const absl::Time start = absl::Now();
  absl::Status saved = client_->Checkpoint(job->job(), dir).status();
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(saved.code(), absl::StatusCode::kDeadlineExceeded) << saved;
  EXPECT_THAT(saved.message(), HasSubstr("ShardsSaved from worker 'w1' (rank 1)"));
  EXPECT_GE(took, absl::Milliseconds(400));
  EXPECT_LT(took, absl::Seconds(20));
  EXPECT_FALSE(model::ReadCheckpointManifest(dir).ok()) << "a checkpoint was published";
  absl::StatusOr<v1::JobStatus> status = client_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), v1::JOB_STATE_READY);
  std::filesystem::remove_all(dir);
}

// Committing is a fraction of a step: a rank that does not commit within the step's deadline is
// named, and the job (not recoverable here: its replicas may differ now) fails at once instead of
// waiting for the 30-minute step_timeout.
TEST_F(CoordinatorDeadlineTest, AWorkerThatDoesNotCommitMissesTheStepDeadline) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  workers_[1]->IgnoreCommit(2);
  ASSERT_TRUE(client_->TrainStep(job->job(), MakeBatch(4).view()).ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::StepResult> r = client_->TrainStep(job->job(), MakeBatch(4).view());
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("waiting for Committed of step 2"));
  EXPECT_GE(took, absl::Milliseconds(400));
  EXPECT_LT(took, absl::Seconds(20));
  absl::StatusOr<v1::JobStatus> status = client_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status->reason(), HasSubstr("step 2 was not committed everywhere"));
}

class CoordinatorRootTest : public CoordinatorServiceTest {
 protected:
  CoordinatorOptions Options() const override {
    CoordinatorOptions options;
    options.checkpoint_root = ::testing::TempDir() + "/coordinator_root";
    mkdir(options.checkpoint_root.c_str(), 0755);
    return options;
  }
};

TEST_F(CoordinatorRootTest, CheckpointsOutsideTheRootArePermissionDenied) {
  AddWorkers(1);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(1, 1));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string root = ::testing::TempDir() + "/coordinator_root";
  for (const std::string& bad :
       {std::string("/etc/pipetrain-ckpt"), root + "/../escape", std::string("../escape")}) {
    absl::StatusOr<v1::CheckpointResponse> r = client_->Checkpoint(job->job(), bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("outside the checkpoint root")) << bad;
  }
  // Inside the root, relative or absolute, it works; the response names the real directory.
  absl::StatusOr<v1::CheckpointResponse> r = client_->Checkpoint(job->job(), "job-a/ckpt");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(absl::EndsWith(r->directory(), "/coordinator_root/job-a/ckpt")) << r->directory();
  EXPECT_TRUE(model::VerifyCheckpoint(r->directory()).ok());
  ASSERT_TRUE(client_->FinishJob(job->job()).ok());
  v1::JobSpec spec = MakeSpec(1, 1);
  spec.set_resume_from("/etc");
  EXPECT_EQ(client_->CreateJob(spec).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(CoordinatorLeaseTest, WithoutACheckpointRootThereAreNoCheckpoints) {
  AddWorkers(1);
  absl::StatusOr<v1::JobStatus> job = client_->CreateJob(MakeSpec(1, 1));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::CheckpointResponse> r =
      client_->Checkpoint(job->job(), ::testing::TempDir() + "/no_root_ckpt");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("start it with --checkpoint-root"));
}

}  // namespace
}  // namespace pipetrain::coordinator
