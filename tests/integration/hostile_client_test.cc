// Hostile and absurd network clients against real daemons on 127.0.0.1 (issue 10): random bytes
// on a raw TCP socket, an HTTP/2 preface followed by garbage, an HTTP/2 frame whose header
// promises more bytes than it carries, oversized and inconsistent gRPC messages (a tensor frame
// cut short, a fake worker registration, RPCs out of order or for unknown jobs) to the coordinator
// and to both workers. Afterwards every daemon still answers its health check and a job still
// trains, its losses bit for bit those of `pipetrain reference`. Every process is started by the
// test and signalled by its PID only.
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/sdk/client.h"
#include "common/wire/frame_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/coordinator.grpc.pb.h"
#include "pipetrain/v1/worker_control.grpc.pb.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/link/peer_link.h"
#include "tests/integration/daemons.h"
#include "tests/integration/daemons_fixture.h"
#include "tests/integration/run_command.h"

namespace pipetrain {
namespace {

using testing::Example;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ReadFile;

constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
constexpr int64_t kMaxMessage = int64_t{2} << 20;  // the coordinator's --max-message-size here

// `n` pseudo-random bytes (fixed seed `seed`).
std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(gen());
  return s;
}

// Connects to HOST:PORT (IPv4), sends `bytes`, half-closes, and reads whatever the daemon answers
// until it closes the connection or 3 s pass. Returns the number of bytes the daemon sent (-1 if
// the connection failed).
int64_t SendRaw(const std::string& address, const std::string& bytes) {
  const std::vector<std::string> parts = absl::StrSplit(address, ':');
  int port = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &port)) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, parts[0].c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  // The daemon may close early (a bad preface): later sends then fail, which is fine.
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  int64_t received = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(3);
  char buf[4096];
  while (absl::Now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    received += n;
  }
  close(fd);
  return received;
}

// A 9-byte HTTP/2 frame header: payload length, type, flags, stream id.
std::string FrameHeader(uint32_t length, uint8_t type, uint8_t flags, uint32_t stream) {
  std::string h(9, '\0');
  h[0] = static_cast<char>(length >> 16);
  h[1] = static_cast<char>(length >> 8);
  h[2] = static_cast<char>(length);
  h[3] = static_cast<char>(type);
  h[4] = static_cast<char>(flags);
  h[5] = static_cast<char>((stream >> 24) & 0x7F);
  h[6] = static_cast<char>(stream >> 16);
  h[7] = static_cast<char>(stream >> 8);
  h[8] = static_cast<char>(stream);
  return h;
}

std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

grpc::ByteBuffer Buffer(const std::string& bytes) {
  grpc::Slice slice(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&slice, 1);
}

std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

// Calls `method` on `address` as a bidi stream of raw messages: sends `metadata`, writes each of
// `messages` (stopping at the first failed write), half-closes and reads until the daemon ends
// the call (at most 5 s). Returns the call's final status.
grpc::Status RawStream(const std::string& address, const std::string& method,
                       const std::map<std::string, std::string>& metadata,
                       const std::vector<std::string>& messages) {
  grpc::GenericStub stub(Channel(address));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  for (const auto& [key, value] : metadata) context.AddMetadata(key, value);
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&context, method, &cq);
  void* tag = nullptr;
  bool ok = false;
  call->StartCall(&tag);
  cq.Next(&tag, &ok);
  bool open = ok;
  for (size_t i = 0; open && i < messages.size(); ++i) {
    call->Write(Buffer(messages[i]), &tag);
    cq.Next(&tag, &ok);
    open = ok;
  }
  if (open) {
    call->WritesDone(&tag);
    cq.Next(&tag, &ok);
  }
  for (int i = 0; open && i < 1000; ++i) {  // every message the daemon sends back, if any
    grpc::ByteBuffer in;
    call->Read(&in, &tag);
    cq.Next(&tag, &ok);
    open = ok;
  }
  grpc::Status status;
  call->Finish(&status, &tag);
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

// The gRPC health service's answer for the whole server: true if SERVING.
bool Healthy(const std::string& address) {
  grpc::GenericStub stub(Channel(address));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::CompletionQueue cq;
  const grpc::ByteBuffer request = Buffer("");  // HealthCheckRequest{service: ""}
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  int tag = 1;
  call->Finish(&response, &status, &tag);
  void* got = nullptr;
  bool ok = false;
  cq.Next(&got, &ok);
  cq.Shutdown();
  while (cq.Next(&got, &ok)) {
  }
  // HealthCheckResponse{status: SERVING (1)}.
  return status.ok() && Bytes(response) == std::string("\x08\x01", 2);
}

// The {"step": N, "loss": X prefixes of --json lines.
std::vector<std::string> LossLines(const std::string& out) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    if (!absl::StartsWith(line, "{\"step\"")) continue;
    const size_t loss = line.find("\"loss\": ");
    lines.emplace_back(line.substr(0, line.find_first_of(",}", loss)));
  }
  return lines;
}

// A valid job for the daemons' two workers: a linear layer and a ReLU, 2 stages.
v1::JobSpec SmallSpec() {
  v1::JobSpec spec;
  spec.set_schedule("1f1b");
  spec.set_stages(2);
  spec.set_microbatches(2);
  spec.mutable_optimizer()->mutable_sgd()->set_lr(0.1f);
  spec.mutable_model()->set_input_features(4);
  spec.mutable_model()->add_layers()->mutable_linear()->set_out_features(3);
  spec.mutable_model()->add_layers()->mutable_relu();
  spec.mutable_model()->mutable_loss()->mutable_softmax_cross_entropy();
  return spec;
}

// A CreateJobRequest of SmallSpec() whose serialization has exactly `bytes` bytes (> 100): the
// padding is an unknown field, which the coordinator parses and ignores.
v1::CreateJobRequest RequestOfSize(int64_t bytes) {
  v1::CreateJobRequest request;
  *request.mutable_spec() = SmallSpec();
  const int64_t base = static_cast<int64_t>(request.ByteSizeLong());
  // Field 1000, length-delimited: a 2-byte tag, a 3-byte length (for 16 KiB to 2 MiB) and the data.
  request.GetReflection()->MutableUnknownFields(&request)->AddLengthDelimited(
      1000, std::string(static_cast<size_t>(bytes - base - 2 - 3), 'p'));
  return request;
}

class HostileClientTest : public testing::DaemonsTest {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("pipetrain_hostile_");
    ASSERT_FALSE(dir_.empty());
    ASSERT_EQ(daemons_.Start(dir_, 2,
                             {"--max-message-size", absl::StrCat(kMaxMessage), "--max-layers", "64",
                              "--max-concurrent-streams", "16"},
                             {"--max-concurrent-streams", "8"}),
              "");
    absl::StatusOr<std::vector<v1::WorkerInfo>> workers = daemons_.client().ListWorkers();
    ASSERT_TRUE(workers.ok()) << workers.status();
    for (const v1::WorkerInfo& w : *workers) targets_.push_back(w.address());
    targets_.push_back(daemons_.address());
    ASSERT_EQ(targets_.size(), 3u);
    stub_ = v1::Coordinator::NewStub(Channel(daemons_.address()));
    worker_stub_ = v1::WorkerControl::NewStub(Channel(daemons_.address()));
  }

  // Every daemon answers its health check and runs; the logs if not.
  void ExpectAllHealthy() {
    for (const std::string& t : targets_) EXPECT_TRUE(Healthy(t)) << t;
    for (pid_t pid : daemons_.workers()) EXPECT_EQ(kill(pid, 0), 0);
    EXPECT_EQ(kill(daemons_.coordinator(), 0), 0);
  }

  // A 3-step `pipetrain train` on the daemons gives the losses of `pipetrain reference`.
  void ExpectAJobTrainsBitwise() {
    // Both (real) workers idle and nobody else registered.
    const absl::Time deadline = absl::Now() + absl::Seconds(15);
    size_t listed = 0;
    while (absl::Now() < deadline) {
      absl::StatusOr<std::vector<v1::WorkerInfo>> w = daemons_.client().ListWorkers();
      ASSERT_TRUE(w.ok()) << w.status();
      listed = w->size();
      if (listed == 2) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_EQ(listed, 2u) << ReadFile(dir_ + "/coordinator.log");
    const std::string flags = absl::StrCat(" --model ", Example("mlp_digits.textproto"),
                                           " --data digits --batch 16 --microbatches 2 --seed 5 "
                                           "--optimizer adamw:lr=1e-2 --json --steps 3");
    const testing::CommandRun ref =
        testing::RunCommand(absl::StrCat(PIPETRAIN_BINARY, " reference", flags, " 2>&1"));
    ASSERT_EQ(ref.exit_code, 0) << ref.out;
    const testing::CommandRun train = testing::RunCommand(
        absl::StrCat(PIPETRAIN_BINARY, " train --coordinator ", daemons_.address(),
                     " --stages 2 --schedule 1f1b", flags, " 2>", dir_, "/train.err"));
    ASSERT_EQ(train.exit_code, 0) << train.out << ReadFile(dir_ + "/train.err")
                                  << ReadFile(dir_ + "/coordinator.log");
    const std::vector<std::string> want = LossLines(ref.out);
    ASSERT_EQ(want.size(), 3u) << ref.out;
    EXPECT_EQ(LossLines(train.out), want);
  }

  std::vector<std::string> targets_;  // both workers' addresses, then the coordinator's
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::unique_ptr<v1::WorkerControl::Stub> worker_stub_;
};

TEST_F(HostileClientTest, RawBytesAndBrokenHttp2LeaveEveryDaemonServing) {
  for (size_t t = 0; t < targets_.size(); ++t) {
    SCOPED_TRACE(targets_[t]);
    // Random bytes: not even a preface.
    EXPECT_GE(SendRaw(targets_[t], RandomBytes(64 << 10, 1 + t)), 0);
    // An empty connection.
    EXPECT_GE(SendRaw(targets_[t], ""), 0);
    // A valid preface, then garbage.
    EXPECT_GE(SendRaw(targets_[t], kPreface + RandomBytes(16 << 10, 100 + t)), 0);
    // A valid preface and SETTINGS, then a DATA frame on stream 1 promising 16 MiB - 1 and
    // carrying 10 bytes, and a HEADERS frame whose HPACK block is garbage.
    EXPECT_GE(SendRaw(targets_[t], kPreface + FrameHeader(0, 4, 0, 0) +
                                       FrameHeader((1 << 24) - 1, 0, 0, 1) + RandomBytes(10, 7)),
              0);
    EXPECT_GE(SendRaw(targets_[t], kPreface + FrameHeader(0, 4, 0, 0) +
                                       FrameHeader(64, 1, 0x4 | 0x1, 1) + RandomBytes(64, 8)),
              0);
    // A HEADERS frame far over the default frame size limit (16 KiB).
    EXPECT_GE(SendRaw(targets_[t], kPreface + FrameHeader(0, 4, 0, 0) +
                                       FrameHeader(1 << 20, 1, 0x4, 1) + RandomBytes(1 << 20, 9)),
              0);
  }
  ExpectAllHealthy();
  ExpectAJobTrainsBitwise();
}

TEST_F(HostileClientTest, MalformedExchangeStreamsAreRefusedByTheWorkers) {
  // A tensor frame for an unknown job, and the same frame cut short: its header promises a
  // 64 x 64 tensor of which the payload carries a few bytes.
  auto tensor = std::make_shared<math::Matrix>(math::Matrix::Constant(64, 64, 1.5f));
  absl::StatusOr<std::vector<grpc::ByteBuffer>> frames = wire::EncodeTensor(
      {"job-nope", 1}, {0, 0, 1, wire::TensorKind::kActivation}, tensor, wire::kMinFragmentBytes);
  ASSERT_TRUE(frames.ok()) << frames.status();
  const std::string frame = Bytes((*frames)[0]);
  const std::string cut = frame.substr(0, frame.size() / 2);
  const std::map<std::string, std::string> stranger = {{"pipetrain-peer-bin", "stage/0"},
                                                       {"pipetrain-job-bin", "job-nope"},
                                                       {"pipetrain-generation", "1"}};
  const std::map<std::string, std::string> bad_generation = {{"pipetrain-peer-bin", "coordinator"},
                                                             {"pipetrain-job-bin", "job-nope"},
                                                             {"pipetrain-generation", "-5"}};
  for (size_t w = 0; w < 2; ++w) {
    SCOPED_TRACE(targets_[w]);
    const std::string& worker = targets_[w];
    // No hello at all, a negative generation, an unknown job (with a whole frame, a cut one,
    // garbage).
    EXPECT_FALSE(RawStream(worker, link::kExchangeMethod, {}, {frame}).ok());
    EXPECT_FALSE(RawStream(worker, link::kExchangeMethod, bad_generation, {frame}).ok());
    EXPECT_FALSE(RawStream(worker, link::kExchangeMethod, stranger, {frame, cut}).ok());
    EXPECT_FALSE(RawStream(worker, link::kExchangeMethod, stranger, {cut}).ok());
    EXPECT_FALSE(
        RawStream(worker, link::kExchangeMethod, stranger, {RandomBytes(4096, 3 + w)}).ok());
    // A stream for a job the worker does not run ends ABORTED before any frame is read, however
    // big: the frame cap (wire::kMaxFrameMessageBytes, the worker server's receive limit) is seen
    // on a method that reads its request, one byte over it is RESOURCE_EXHAUSTED from gRPC.
    const std::string over(static_cast<size_t>(wire::kMaxFrameMessageBytes) + 1, '\x7a');
    const grpc::Status unknown = RawStream(worker, link::kExchangeMethod, stranger, {over});
    EXPECT_EQ(unknown.error_code(), grpc::StatusCode::ABORTED) << unknown.error_message();
    const grpc::Status big = RawStream(worker, "/grpc.health.v1.Health/Check", {}, {over});
    EXPECT_EQ(big.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << big.error_message();
    // Another service's method on a worker.
    const grpc::Status other =
        RawStream(worker, "/pipetrain.v1.Coordinator/Join", {}, {RandomBytes(16, 4)});
    EXPECT_EQ(other.error_code(), grpc::StatusCode::UNIMPLEMENTED) << other.error_message();
  }
  ExpectAllHealthy();
  ExpectAJobTrainsBitwise();
}

TEST_F(HostileClientTest, FakeWorkersAndOutOfOrderRpcsLeaveTheCoordinatorServing) {
  const std::string& coordinator = targets_[2];
  // Garbage where protobuf messages are expected, on every method of the coordinator. A unary
  // request that does not parse is an error; on a client-streaming method gRPC ends the stream as
  // if the client had half-closed (whatever the status, the daemon must go on serving).
  for (const char* method : {"CreateJob", "GetJob", "FetchState", "ListWorkers", "Checkpoint"}) {
    const grpc::Status s =
        RawStream(coordinator, absl::StrCat("/pipetrain.v1.Coordinator/", method), {},
                  {RandomBytes(512, 11), RandomBytes(3, 12)});
    EXPECT_FALSE(s.ok()) << method;
  }
  for (const char* method : {"Join", "Train", "PutState"}) {
    RawStream(coordinator, absl::StrCat("/pipetrain.v1.Coordinator/", method), {},
              {RandomBytes(512, 11), RandomBytes(3, 12)});
  }
  // A worker's events out of order: a StepDone and a Committed before any registration.
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    auto join = worker_stub_->Join(&context);
    v1::WorkerEvent event;
    event.mutable_step_done();
    join->Write(event);
    event.mutable_committed();
    join->Write(event);
    join->WritesDone();
    v1::WorkerCommand command;
    while (join->Read(&command)) {
    }
    EXPECT_FALSE(join->Finish().ok());
  }
  // A fake worker registers (an address nobody serves), claims a step of an unknown job, then
  // disappears: it must be gone from the membership before the real job below.
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    auto join = worker_stub_->Join(&context);
    v1::WorkerEvent event;
    v1::RegisterWorker* reg = event.mutable_register_();
    reg->set_name("intruder");
    reg->set_address("127.0.0.1:1");
    reg->set_cores(1);
    ASSERT_TRUE(join->Write(event));
    v1::WorkerEvent forged;
    forged.mutable_step_done()->set_job("job-nope");
    join->Write(forged);
    forged.mutable_assigned()->set_job("job-nope");
    join->Write(forged);
    context.TryCancel();
    v1::WorkerCommand command;
    while (join->Read(&command)) {
    }
    join->Finish();
  }
  // RPCs for jobs that do not exist, and a Train batch before any CreateJob.
  {
    grpc::ClientContext context;
    v1::FetchStateRequest request;
    request.set_job("job-nope");
    request.set_worker("w0");
    auto fetch = worker_stub_->FetchState(&context, request);
    v1::StateChunk chunk;
    while (fetch->Read(&chunk)) {
    }
    EXPECT_EQ(fetch->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext context;
    v1::PutStateResponse response;
    auto put = worker_stub_->PutState(&context, &response);
    v1::PutStateRequest request;
    request.set_job("job-nope");
    request.set_worker("w0");
    request.mutable_chunk()->set_data(RandomBytes(1000, 13));
    put->Write(request);
    put->WritesDone();
    EXPECT_FALSE(put->Finish().ok());
  }
  {
    grpc::ClientContext context;
    auto train = stub_->Train(&context);
    v1::TrainRequest request;
    request.set_job("job-nope");
    request.set_samples(1 << 30);
    train->Write(request);
    train->WritesDone();
    v1::StepResult result;
    while (train->Read(&result)) {
    }
    EXPECT_FALSE(train->Finish().ok());
  }
  ExpectAllHealthy();
  ExpectAJobTrainsBitwise();
}

TEST_F(HostileClientTest, MessageSizeAndLayerCapsOfTheCoordinator) {
  // One byte over --max-message-size: refused by gRPC before it is parsed.
  v1::CreateJobRequest over = RequestOfSize(kMaxMessage + 1);
  ASSERT_EQ(static_cast<int64_t>(over.ByteSizeLong()), kMaxMessage + 1);
  {
    grpc::ClientContext context;
    v1::JobStatus status;
    const grpc::Status s = stub_->CreateJob(&context, over, &status);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  }
  // Exactly at the cap: received and validated; a valid job, so it is created (and cancelled).
  v1::CreateJobRequest at = RequestOfSize(kMaxMessage);
  ASSERT_EQ(static_cast<int64_t>(at.ByteSizeLong()), kMaxMessage);
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::JobStatus status;
    const grpc::Status s = stub_->CreateJob(&context, at, &status);
    EXPECT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
    if (s.ok()) {
      ASSERT_TRUE(daemons_.client().CancelJob(status.job()).ok());
    }
  }
  // --max-layers 64: 65 layers are refused naming the flag; 64 pass the cap.
  v1::JobSpec spec = SmallSpec();
  for (int i = 0; i < 62; ++i) spec.mutable_model()->add_layers()->mutable_relu();
  ASSERT_EQ(spec.model().layers_size(), 64);
  spec.set_microbatches(1025);  // over the default --max-microbatches: the next cap to fail
  absl::StatusOr<v1::JobStatus> job = daemons_.client().CreateJob(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kResourceExhausted) << job.status();
  EXPECT_THAT(job.status().message(), HasSubstr("--max-microbatches"));
  EXPECT_THAT(job.status().message(), Not(HasSubstr("--max-layers")));
  spec.mutable_model()->add_layers()->mutable_relu();
  job = daemons_.client().CreateJob(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kResourceExhausted) << job.status();
  EXPECT_THAT(job.status().message(),
              HasSubstr("the model has 65 layers, more than the limit of 64 (coordinator flag "
                        "--max-layers)"));
  ExpectAllHealthy();
  ExpectAJobTrainsBitwise();
}

}  // namespace
}  // namespace pipetrain
