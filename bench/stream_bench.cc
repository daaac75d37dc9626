// Stream throughput of the data plane between two processes on loopback: tensors of 64 KiB, 1, 4
// and 16 MiB sent through the real frame codec and a PeerLink (StageWorker.Exchange, credit
// window, one copy on receive), beside raw TCP with the same sizes and process layout, measured in
// the same run. Prints MB/s (1 MB = 10^6 bytes) and the ratio gRPC / TCP (goal >= 0.8).
//
// Layout: this process is the receiver; for each case it spawns itself with --role=sender, which
// connects to 127.0.0.1, streams warm-up + measured tensors, waits for a one-tensor ack and exits.
// The receiver times from the arrival of the last warm-up tensor to that of the last tensor.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/math/tensor.h"
#include "common/util/status_macros.h"
#include "common/wire/frame_codec.h"
#include "server/worker/exchange_service.h"
#include "server/worker/peer_link.h"

ABSL_FLAG(std::string, role, "", "internal: 'sender' for the spawned child; empty for the driver");
ABSL_FLAG(std::string, mode, "grpc", "internal (sender): 'grpc' or 'tcp'");
ABSL_FLAG(int, port, 0, "internal (sender): the receiver's port on 127.0.0.1");
ABSL_FLAG(int64_t, bytes, 0, "internal (sender): bytes per tensor");
ABSL_FLAG(int64_t, count, 0, "internal (sender): tensors to send, warm-up included");
ABSL_FLAG(int64_t, budget_mib, 64, "MiB streamed per run of a (size, transport) case");
ABSL_FLAG(int, repeats, 3, "runs per case; the best is reported");
ABSL_FLAG(bool, tune_malloc, true,
          "raise malloc's mmap and trim thresholds in both processes (see main)");
ABSL_FLAG(int64_t, fragment_mib, 1, "PeerLink fragment size in MiB (1-4)");
ABSL_FLAG(int64_t, window_mib, 8, "PeerLink credit window in MiB (>= 4)");

namespace pipetrain::bench {
namespace {

using wire::TensorKey;
using wire::TensorKind;

constexpr int64_t kCols = 1024;  // floats per row: a tensor of B bytes is [B / 4096, 1024].
constexpr char kJob[] = "bench";
constexpr absl::Duration kCaseTimeout = absl::Seconds(120);

// Typed options, parsed once in main().
struct Options {
  std::string role;
  std::string mode;
  int port = 0;
  int64_t bytes = 0;
  int64_t count = 0;
  int64_t budget_bytes = 0;
  int repeats = 1;
  bool tune_malloc = true;
  worker::LinkOptions link;
};

wire::FrameValidation Validation() {
  wire::FrameValidation v;
  v.expected = wire::StreamIdentity{kJob, 1};
  v.num_microbatches = 1 << 30;
  v.num_chunks = 2;
  v.max_tensor_bytes = int64_t{1} << 30;
  return v;
}

std::shared_ptr<const math::Matrix> MakeTensor(int64_t bytes) {
  auto m = std::make_shared<math::Matrix>(bytes / (kCols * 4), kCols);
  for (int64_t i = 0; i < m->size(); ++i) m->data()[i] = static_cast<float>(i % 251);
  return m;
}

// ---------------------------------------------------------------------------------------------
// Raw TCP.

absl::Status WriteAll(int fd, const void* data, int64_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, static_cast<size_t>(n), MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    p += w;
    n -= w;
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, void* data, int64_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, static_cast<size_t>(n), 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
    p += r;
    n -= r;
  }
  return absl::OkStatus();
}

// Sender: [u64 bytes][u64 index] + payload per tensor, then waits for a 1-byte ack.
absl::Status TcpSend(const Options& options) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(options.port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("connect: ", std::strerror(errno)));
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  auto tensor = MakeTensor(options.bytes);
  absl::Status status;
  for (int64_t i = 0; i < options.count && status.ok(); ++i) {
    const uint64_t header[2] = {static_cast<uint64_t>(options.bytes), static_cast<uint64_t>(i)};
    status = WriteAll(fd, header, sizeof(header));
    if (status.ok()) status = WriteAll(fd, tensor->data(), options.bytes);
  }
  char ack = 0;
  if (status.ok()) status = ReadAll(fd, &ack, 1);
  ::close(fd);
  return status;
}

// Receiver: one fresh Matrix per tensor (as the gRPC path allocates), read straight into it.
absl::StatusOr<double> TcpReceive(int listen_fd, int64_t bytes, int64_t warmup, int64_t count) {
  const int fd = ::accept(listen_fd, nullptr, nullptr);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("accept: ", std::strerror(errno)));
  absl::Time start;
  absl::Status status;
  for (int64_t i = 0; i < count && status.ok(); ++i) {
    uint64_t header[2];
    status = ReadAll(fd, header, sizeof(header));
    if (!status.ok()) break;
    if (header[0] != static_cast<uint64_t>(bytes)) {
      status = absl::DataLossError("bad tensor size");
      break;
    }
    math::Matrix m(bytes / (kCols * 4), kCols);
    status = ReadAll(fd, m.data(), bytes);
    if (i + 1 == warmup) start = absl::Now();
  }
  const absl::Time end = absl::Now();
  const char ack = 1;
  if (status.ok()) status = WriteAll(fd, &ack, 1);
  ::close(fd);
  PT_RETURN_IF_ERROR(status);
  return absl::ToDoubleSeconds(end - start);
}

// ---------------------------------------------------------------------------------------------
// gRPC Exchange.

absl::Status GrpcSend(const Options& options) {
  const std::string address = absl::StrCat("127.0.0.1:", options.port);
  // Notified once, by the ack or by a link failure.
  absl::Notification acked;
  std::atomic<bool> notified{false};
  auto notify = [&acked, &notified] {
    if (!notified.exchange(true)) acked.Notify();
  };
  worker::LinkCallbacks callbacks;
  callbacks.on_tensor = [notify](const TensorKey&, math::Matrix) {
    notify();
    return absl::OkStatus();
  };
  callbacks.on_error = [notify](const absl::Status&) { notify(); };
  auto link = worker::PeerLink::Connect(worker::CreateExchangeChannel(address), address,
                                        worker::PeerHello{"bench-sender", {kJob, 1}}, options.link,
                                        {Validation(), callbacks});
  PT_RETURN_IF_ERROR(link.status());
  auto tensor = MakeTensor(options.bytes);
  for (int64_t i = 0; i < options.count; ++i) {
    PT_RETURN_IF_ERROR(
        (*link)->Send(TensorKey{0, static_cast<int32_t>(i), 1, TensorKind::kActivation}, tensor));
  }
  if (!acked.WaitForNotificationWithTimeout(kCaseTimeout)) {
    return absl::DeadlineExceededError("no ack from the receiver");
  }
  return (*link)->status();
}

// The receiving side of one gRPC case: counts tensors, timestamps, acks the sender.
class GrpcReceiver {
 public:
  GrpcReceiver(int64_t warmup, int64_t count) : warmup_(warmup), count_(count) {}

  absl::StatusOr<worker::LinkSettings> Accept(std::unique_ptr<worker::PeerLink> link) {
    absl::MutexLock lock(&mu_);
    link_ = std::move(link);
    worker::LinkCallbacks callbacks;
    callbacks.on_tensor = [this](const TensorKey& key, math::Matrix tensor) {
      OnTensor();
      return absl::OkStatus();
    };
    callbacks.on_error = [this](const absl::Status& status) {
      absl::MutexLock error_lock(&mu_);
      if (error_.ok()) error_ = status;
    };
    return worker::LinkSettings{Validation(), callbacks};
  }

  // Seconds from the last warm-up tensor to the last tensor.
  absl::StatusOr<double> Wait() {
    absl::MutexLock lock(&mu_);
    auto finished = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return received_ == count_ || !error_.ok();
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&finished), kCaseTimeout)) {
      return absl::DeadlineExceededError(absl::StrCat("received ", received_, " of ", count_));
    }
    if (received_ < count_) return error_;  // the sender may hang up once acked.
    return absl::ToDoubleSeconds(end_ - start_);
  }

  void Close() {
    std::unique_ptr<worker::PeerLink> link;
    {
      absl::MutexLock lock(&mu_);
      link = std::move(link_);
    }
    link.reset();
  }

 private:
  void OnTensor() {
    worker::PeerLink* ack_on = nullptr;
    {
      absl::MutexLock lock(&mu_);
      ++received_;
      if (received_ == warmup_) start_ = absl::Now();
      if (received_ == count_) {
        end_ = absl::Now();
        ack_on = link_.get();
      }
    }
    if (ack_on != nullptr) {
      (void)ack_on->Send(TensorKey{0, 0, 0, TensorKind::kGradient}, MakeTensor(4096));
    }
  }

  const int64_t warmup_;
  const int64_t count_;
  absl::Mutex mu_;  // protects everything below.
  std::unique_ptr<worker::PeerLink> link_ ABSL_GUARDED_BY(mu_);
  int64_t received_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time start_ ABSL_GUARDED_BY(mu_);
  absl::Time end_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------------------------
// Driver.

// Spawns this binary as the sender of one case; returns its pid.
absl::StatusOr<pid_t> SpawnSender(const Options& options, const std::string& mode, int port,
                                  int64_t bytes, int64_t count) {
  std::vector<std::string> args = {
      "/proc/self/exe",
      "--role=sender",
      absl::StrCat("--mode=", mode),
      absl::StrCat("--port=", port),
      absl::StrCat("--bytes=", bytes),
      absl::StrCat("--count=", count),
      absl::StrCat("--fragment_mib=", options.link.fragment_bytes >> 20),
      absl::StrCat("--window_mib=", options.link.window_bytes >> 20),
      absl::StrCat("--tune_malloc=", options.tune_malloc ? "true" : "false"),
  };
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ);
  if (rc != 0) return absl::InternalError(absl::StrCat("posix_spawn: ", std::strerror(rc)));
  return pid;
}

// Waits for the sender `pid`; OK if it exited with status 0.
absl::Status ReapSender(pid_t pid, bool kill_first) {
  if (kill_first) ::kill(pid, SIGKILL);
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0) {
    if (errno != EINTR) return absl::InternalError("waitpid");
  }
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    return absl::InternalError(absl::StrCat("sender exited abnormally (", wstatus, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> RunTcpCase(const Options& options, int64_t bytes, int64_t warmup,
                                  int64_t count) {
  const int listen_fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (listen_fd < 0) return absl::InternalError("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listen_fd, 1) != 0 ||
      ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(listen_fd);
    return absl::InternalError(absl::StrCat("listen: ", std::strerror(errno)));
  }
  auto pid = SpawnSender(options, "tcp", ntohs(addr.sin_port), bytes, count);
  if (!pid.ok()) {
    ::close(listen_fd);
    return pid.status();
  }
  absl::StatusOr<double> seconds = TcpReceive(listen_fd, bytes, warmup, count);
  ::close(listen_fd);
  PT_RETURN_IF_ERROR(ReapSender(*pid, /*kill_first=*/!seconds.ok()));
  return seconds;
}

absl::StatusOr<double> RunGrpcCase(const Options& options, int64_t bytes, int64_t warmup,
                                   int64_t count) {
  GrpcReceiver receiver(warmup, count);
  auto service = worker::ExchangeService::Create(
      options.link, [&receiver](const worker::PeerHello&, std::unique_ptr<worker::PeerLink> link) {
        return receiver.Accept(std::move(link));
      });
  PT_RETURN_IF_ERROR(service.status());
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  (*service)->RegisterOn(&builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return absl::InternalError("cannot start the server");
  absl::StatusOr<double> seconds;
  auto pid = SpawnSender(options, "grpc", port, bytes, count);
  if (pid.ok()) {
    seconds = receiver.Wait();
    absl::Status reaped = ReapSender(*pid, /*kill_first=*/!seconds.ok());
    if (seconds.ok() && !reaped.ok()) seconds = reaped;
  } else {
    seconds = pid.status();
  }
  receiver.Close();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return seconds;
}

std::string SizeName(int64_t bytes) {
  return bytes >= (1 << 20) ? absl::StrCat(bytes >> 20, " MiB") : absl::StrCat(bytes >> 10, " KiB");
}

int Drive(const Options& options) {
  std::printf(
      "stream_bench: 127.0.0.1, sender and receiver in separate processes; gRPC = frame codec + "
      "PeerLink (fragment %lld MiB, credit window %lld MiB); %lld MiB per run, best of %d\n",
      static_cast<long long>(options.link.fragment_bytes >> 20),
      static_cast<long long>(options.link.window_bytes >> 20),
      static_cast<long long>(options.budget_bytes >> 20), options.repeats);
  std::printf("%-8s %8s %14s %14s %7s\n", "size", "tensors", "raw TCP MB/s", "gRPC MB/s", "ratio");
  bool all_ok = true;
  double worst = 1e9;
  for (int64_t bytes : {int64_t{64} << 10, int64_t{1} << 20, int64_t{4} << 20, int64_t{16} << 20}) {
    const int64_t measured = std::max<int64_t>(8, options.budget_bytes / bytes);
    const int64_t warmup = std::max<int64_t>(2, measured / 8);
    const int64_t count = warmup + measured;
    // Best of `repeats` alternating runs: the machine is shared, and the best run is the one
    // least disturbed by other load.
    double tcp_best = 1e30, grpc_best = 1e30;
    absl::Status failure;
    for (int r = 0; r < options.repeats && failure.ok(); ++r) {
      absl::StatusOr<double> tcp = RunTcpCase(options, bytes, warmup, count);
      absl::StatusOr<double> grpc = RunGrpcCase(options, bytes, warmup, count);
      if (!tcp.ok()) failure = tcp.status();
      if (!grpc.ok()) failure = grpc.status();
      if (failure.ok()) {
        tcp_best = std::min(tcp_best, *tcp);
        grpc_best = std::min(grpc_best, *grpc);
      }
    }
    if (!failure.ok()) {
      std::printf("%-8s failed: %s\n", SizeName(bytes).c_str(), failure.ToString().c_str());
      all_ok = false;
      continue;
    }
    // Timing starts at the last warm-up tensor: `measured` tensors arrive after it.
    const double moved = static_cast<double>(bytes) * static_cast<double>(measured);
    const double tcp_mbs = moved / tcp_best / 1e6;
    const double grpc_mbs = moved / grpc_best / 1e6;
    worst = std::min(worst, grpc_mbs / tcp_mbs);
    std::printf("%-8s %8lld %14.0f %14.0f %7.2f\n", SizeName(bytes).c_str(),
                static_cast<long long>(measured), tcp_mbs, grpc_mbs, grpc_mbs / tcp_mbs);
    std::fflush(stdout);
  }
  if (all_ok) std::printf("worst ratio %.2f (goal >= 0.80)\n", worst);
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace pipetrain::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_tune_malloc)) {
    // Serve multi-MiB buffers (gRPC's receive slices, received tensors) from the heap instead of
    // fresh mmaps, whose page faults and zeroing otherwise dominate the receive path's CPU time.
    // Applies to both transports (both processes); stage_worker should do the same.
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  pipetrain::bench::Options options;
  options.role = absl::GetFlag(FLAGS_role);
  options.mode = absl::GetFlag(FLAGS_mode);
  options.port = absl::GetFlag(FLAGS_port);
  options.bytes = absl::GetFlag(FLAGS_bytes);
  options.count = absl::GetFlag(FLAGS_count);
  options.budget_bytes = absl::GetFlag(FLAGS_budget_mib) << 20;
  options.repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  options.tune_malloc = absl::GetFlag(FLAGS_tune_malloc);
  options.link.fragment_bytes = absl::GetFlag(FLAGS_fragment_mib) << 20;
  options.link.window_bytes = absl::GetFlag(FLAGS_window_mib) << 20;
  if (absl::Status checked = options.link.Check(); !checked.ok()) {
    std::fprintf(stderr, "stream_bench: %s\n", checked.ToString().c_str());
    return 2;
  }
  if (options.role.empty()) return pipetrain::bench::Drive(options);
  if (options.role != "sender" || options.port <= 0 || options.bytes <= 0 ||
      options.bytes % (pipetrain::bench::kCols * 4) != 0 || options.count <= 0) {
    std::fprintf(stderr, "stream_bench: bad sender arguments\n");
    return 2;
  }
  // Keep the gRPC library initialised until exit: otherwise dropping the last channel runs
  // grpc_shutdown(), which in gRPC 1.51 can block for seconds joining its executor threads.
  grpc_init();
  const absl::Status status = options.mode == "tcp" ? pipetrain::bench::TcpSend(options)
                                                    : pipetrain::bench::GrpcSend(options);
  if (!status.ok()) {
    std::fprintf(stderr, "stream_bench sender (%s): %s\n", options.mode.c_str(),
                 status.ToString().c_str());
    return 1;
  }
  return 0;
}
