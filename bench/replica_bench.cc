// The cost of the reduction over data-parallel replicas (server/worker/replica_reducer.h): R
// in-process workers on 127.0.0.1, each with its Mailbox and an Exchange server, linked to its
// reduction partners by real PeerLinks (the lower replica dialling, as stage workers do), reduce
// one chunk's gradients -- the deep benchmark MLP's (examples/deep_mlp.textproto: 16 Linear
// 512x512 and a 512x16 head, 4.2 M floats) -- with ReplicaReducer, as a stage worker does after
// its last W. Beside it, in the same run:
//   step     one replica's compute for its share of a step: the reference trainer on the model
//            over B / R rows in M / R micro-batches (B = 256, M = 8, SGD, one thread), what each
//            replica's single stage computes when S = 1;
//   raw TCP  every worker sending the bytes it sent in the reduction to a partner over one
//            loopback TCP connection per worker at once, received into a buffer (the floor).
// Per R in --replicas (default 2,4) prints: the bytes each worker sent per step and in how many
// messages, the reduction's time (median of --rounds), and the ratios reduction / step and
// reduction / raw TCP, then the CPU time the whole process (every worker) spent per reduction
// (mean) and on the raw TCP transfer, and their ratio: unlike wall time, hardly changed by
// other processes' load. Every worker shares this machine's cores, so the figures are those of R
// workers on one host, not of R hosts.
//
// Usage: replica_bench [--replicas 2,4] [--rounds 5]
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/io/dataset.h"
#include "common/model/model.h"
#include "common/model/reference_trainer.h"
#include "server/link/exchange_service.h"
#include "server/link/peer_link.h"
#include "server/worker/executor.h"
#include "server/worker/gradient_exchange.h"
#include "server/worker/mailbox.h"
#include "server/worker/replica_reducer.h"

ABSL_FLAG(std::string, replicas, "2,4", "replica counts to measure (powers of two >= 2)");
ABSL_FLAG(int, rounds, 5, "measured reductions per replica count (the median is printed)");

namespace pipetrain {
namespace {

using link::LinkOptions;
using link::LinkSettings;
using link::PeerHello;
using link::PeerLink;
using wire::TensorKey;

constexpr char kJob[] = "replica-bench";
constexpr char kSecret[] = "bench-secret";
constexpr int64_t kBatch = 256;
constexpr int64_t kMicrobatches = 8;

// CPU time of the whole process so far (every thread, user + system).
absl::Duration ProcessCpu() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return absl::DurationFromTimeval(u.ru_utime) + absl::DurationFromTimeval(u.ru_stime);
}

absl::Duration Median(std::vector<absl::Duration> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One in-process replica worker: its mailbox, its Exchange server, its links to its partners,
// and the Sender that routes each replica_gradient to the round's partner.
class Node final : public worker::Sender {
 public:
  Node(int me, int replicas) : me_(me), replicas_(replicas) {}
  ~Node() override { Stop(); }

  absl::Status Serve() {
    auto service = link::ExchangeService::Create(
        LinkOptions{},
        [this](const PeerHello& hello,
               std::unique_ptr<PeerLink> accepted) -> absl::StatusOr<LinkSettings> {
          int q = -1;
          absl::string_view name = hello.peer;
          if (!absl::ConsumePrefix(&name, "replica/") || !absl::SimpleAtoi(name, &q)) {
            return absl::FailedPreconditionError("not a replica");
          }
          absl::MutexLock lock(&mu_);
          links_[q] = std::move(accepted);
          return Settings();
        });
    if (!service.ok()) return service.status();
    service_ = *std::move(service);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    service_->RegisterOn(&builder);
    server_ = builder.BuildAndStart();
    return server_ != nullptr ? absl::OkStatus() : absl::InternalError("no server");
  }

  absl::Status Dial(int q, int port) {
    const std::string address = absl::StrCat("127.0.0.1:", port);
    auto link = PeerLink::Connect(link::CreateExchangeChannel(address), address,
                                  PeerHello{absl::StrCat("replica/", me_), {kJob, 1}, kSecret},
                                  LinkOptions{}, Settings());
    if (!link.ok()) return link.status();
    absl::MutexLock lock(&mu_);
    links_[q] = *std::move(link);
    return absl::OkStatus();
  }

  // Waits until a link to each of the log2(R) partners is up.
  bool AwaitLinks() {
    absl::MutexLock lock(&mu_);
    int partners = 0;
    for (int bit = 1; bit < replicas_; bit <<= 1) ++partners;
    auto all = [this, partners]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(links_.size()) == partners;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(30));
  }

  void Send(const TensorKey& key, math::Matrix tensor) override {
    const int q = worker::AllReducePartner(me_, replicas_,
                                           key.microbatch % worker::AllReduceRounds(replicas_));
    PeerLink* link = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto it = links_.find(q);
      if (it != links_.end()) link = it->second.get();
    }
    if (link == nullptr) {
      mailbox_.Abort(absl::InternalError(absl::StrCat("no link to replica ", q)));
      return;
    }
    if (absl::Status s = link->Send(key, std::make_shared<const math::Matrix>(std::move(tensor)));
        !s.ok()) {
      mailbox_.Abort(s);
    }
  }

  void Stop() {
    std::map<int, std::unique_ptr<PeerLink>> links;
    {
      absl::MutexLock lock(&mu_);
      links.swap(links_);
    }
    for (auto& [q, link] : links) link->Shutdown();
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now()));
    server_.reset();
  }

  int port() const { return port_; }
  worker::Mailbox* mailbox() { return &mailbox_; }

 private:
  LinkSettings Settings() {
    LinkSettings s;
    s.validation.expected = wire::StreamIdentity{kJob, 1};
    s.validation.num_microbatches = 1;
    s.validation.num_chunks = 1;
    s.validation.replica_rounds = worker::AllReduceRounds(replicas_);
    s.callbacks.on_tensor = [this](const TensorKey& key, math::Matrix t) {
      return mailbox_.Put(key, std::move(t));
    };
    s.callbacks.on_error = [this](const absl::Status& status) { mailbox_.Abort(status); };
    return s;
  }

  const int me_;
  const int replicas_;
  worker::Mailbox mailbox_;
  std::unique_ptr<link::ExchangeService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Mutex mu_;  // protects links_.
  std::map<int, std::unique_ptr<PeerLink>> links_ ABSL_GUARDED_BY(mu_);
};

// Every worker sends `bytes` to its round-0 partner over loopback TCP at once; the time until
// every byte arrived.
struct Timing {
  absl::Duration wall;
  absl::Duration cpu;  // of every thread of the process.
};

absl::StatusOr<Timing> RawTcp(int replicas, int64_t bytes) {
  std::vector<int> listeners(replicas), ports(replicas);
  for (int i = 0; i < replicas; ++i) {
    listeners[i] = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (listeners[i] < 0 || bind(listeners[i], reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        listen(listeners[i], 1) != 0 ||
        getsockname(listeners[i], reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return absl::InternalError("raw TCP: cannot listen on 127.0.0.1");
    }
    ports[i] = ntohs(a.sin_port);
  }
  std::vector<char> out(static_cast<size_t>(bytes), 'x');
  std::vector<std::thread> threads;
  const absl::Duration cpu = ProcessCpu();
  const absl::Time start = absl::Now();
  for (int i = 0; i < replicas; ++i) {
    threads.emplace_back([&, i] {  // receiver i
      const int fd = accept(listeners[i], nullptr, nullptr);
      std::vector<char> in(1 << 20);
      for (int64_t got = 0; fd >= 0 && got < bytes;) {
        const ssize_t n = read(fd, in.data(), in.size());
        if (n <= 0) break;
        got += n;
      }
      if (fd >= 0) close(fd);
    });
    threads.emplace_back([&, i] {  // sender i -> its partner
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(ports[i ^ 1]));
      if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
      for (int64_t sent = 0; sent < bytes;) {
        const ssize_t n = write(fd, out.data() + sent, static_cast<size_t>(bytes - sent));
        if (n <= 0) break;
        sent += n;
      }
      close(fd);
    });
  }
  for (std::thread& t : threads) t.join();
  const Timing took{absl::Now() - start, ProcessCpu() - cpu};
  for (int fd : listeners) close(fd);
  return took;
}

// One replica's compute for its share of a step (median of `rounds` steps after a warm-up).
absl::StatusOr<absl::Duration> ReplicaStep(const model::Model& model, int replicas, int rounds) {
  model::TrainerOptions o;
  o.microbatches = kMicrobatches / replicas;
  o.seed = 1;
  o.optimizer.lr = 0.01f;
  absl::StatusOr<std::unique_ptr<model::ReferenceTrainer>> trainer =
      model::ReferenceTrainer::Create(&model, o);
  if (!trainer.ok()) return trainer.status();
  io::Batch batch;
  batch.samples = kBatch / replicas;
  batch.inputs.resize(batch.samples, model.input_features());
  batch.targets.resize(batch.samples, 1);
  for (int64_t r = 0; r < batch.samples; ++r) {
    for (int64_t c = 0; c < batch.inputs.cols(); ++c) {
      batch.inputs(r, c) = std::sin(0.01f * static_cast<float>(r * 7 + c));
    }
    batch.targets(r, 0) = static_cast<float>(r % model.output_features());
  }
  std::vector<absl::Duration> times;
  for (int i = 0; i <= rounds; ++i) {
    const absl::Time start = absl::Now();
    absl::StatusOr<model::StepResult> step = (*trainer)->Step(batch);
    if (!step.ok()) return step.status();
    if (i > 0) times.push_back(absl::Now() - start);
  }
  return Median(times);
}

struct Reduction {
  absl::Duration time;
  absl::Duration cpu;      // the process's CPU per reduction (mean over the measured rounds).
  int64_t bytes_sent = 0;  // per worker per step.
};

// Reduces `floats` floats over `replicas` linked Nodes `rounds` times (after a warm-up).
absl::StatusOr<Reduction> Reduce(int replicas, int64_t floats, int rounds) {
  std::vector<std::unique_ptr<Node>> nodes;
  for (int q = 0; q < replicas; ++q) {
    nodes.push_back(std::make_unique<Node>(q, replicas));
    if (absl::Status s = nodes.back()->Serve(); !s.ok()) return s;
  }
  for (int q = 0; q < replicas; ++q) {
    for (int bit = 1; bit < replicas; bit <<= 1) {
      const int p = q ^ bit;
      if (p > q) {
        if (absl::Status s = nodes[q]->Dial(p, nodes[p]->port()); !s.ok()) return s;
      }
    }
  }
  for (auto& n : nodes) {
    if (!n->AwaitLinks()) return absl::DeadlineExceededError("the replica links did not come up");
  }
  std::vector<std::unique_ptr<worker::ReplicaReducer>> reducers;
  for (int q = 0; q < replicas; ++q) {
    auto r = worker::ReplicaReducer::Create(nodes[q].get(), nodes[q]->mailbox(), absl::Seconds(60));
    if (!r.ok()) return r.status();
    reducers.push_back(*std::move(r));
  }
  std::vector<float> grads(static_cast<size_t>(floats));
  for (int64_t i = 0; i < floats; ++i) grads[i] = 1e-3f * static_cast<float>(i % 977);
  std::vector<absl::Duration> times;
  Reduction out;
  absl::Duration cpu;
  for (int round = 0; round <= rounds; ++round) {
    const absl::Duration cpu_start = ProcessCpu();
    const absl::Time start = absl::Now();
    for (int q = 0; q < replicas; ++q) {
      reducers[q]->Start(round + 1);
      if (absl::Status s =
              reducers[q]->Submit(worker::ReductionGroup::Replicas(0, q, replicas), grads);
          !s.ok()) {
        return s;
      }
    }
    for (int q = 0; q < replicas; ++q) {
      auto sums = reducers[q]->Finish();
      if (!sums.ok()) return sums.status();
    }
    if (round > 0) {
      times.push_back(absl::Now() - start);
      cpu += ProcessCpu() - cpu_start;
    }
    out.bytes_sent = reducers[0]->stats().bytes_sent;
  }
  reducers.clear();
  for (auto& n : nodes) n->Stop();
  out.time = Median(times);
  out.cpu = cpu / rounds;
  return out;
}

int Run() {
  absl::StatusOr<v1::ModelSpec> spec =
      model::LoadModelSpecFile(absl::StrCat(PIPETRAIN_SOURCE_DIR, "/examples/deep_mlp.textproto"));
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<model::Model>> model = model::Model::Build(*spec);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  int64_t floats = 0;
  for (int64_t l = 0; l < (*model)->num_layers(); ++l) {
    for (const math::ParamSpec& p : (*model)->layer(l).params()) {
      int64_t n = 1;
      for (int64_t d : p.shape) n *= d;
      floats += n;
    }
  }
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  std::printf(
      "replica reduction of deep_mlp's gradients (%lld floats, %.1f MB), B = %lld, M = %lld,"
      " %d rounds (median)\n",
      static_cast<long long>(floats), floats * 4e-6, static_cast<long long>(kBatch),
      static_cast<long long>(kMicrobatches), rounds);
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_replicas), ',')) {
    int replicas = 0;
    if (!absl::SimpleAtoi(text, &replicas) || worker::AllReduceRounds(replicas) < 2) {
      std::fprintf(stderr, "--replicas: '%s' is not a power of two >= 2\n",
                   std::string(text).c_str());
      return 1;
    }
    absl::StatusOr<Reduction> reduction = Reduce(replicas, floats, rounds);
    absl::StatusOr<absl::Duration> step = ReplicaStep(**model, replicas, rounds);
    if (!reduction.ok() || !step.ok()) {
      std::fprintf(stderr, "R = %d: %s %s\n", replicas, reduction.status().ToString().c_str(),
                   step.status().ToString().c_str());
      return 1;
    }
    absl::StatusOr<Timing> tcp = RawTcp(replicas, reduction->bytes_sent);
    if (!tcp.ok()) {
      std::fprintf(stderr, "%s\n", tcp.status().ToString().c_str());
      return 1;
    }
    const double ms = absl::ToDoubleMilliseconds(reduction->time);
    std::printf(
        "R = %d: sent %.1f MB per worker per step in %d messages; reduction %.1f ms; "
        "one replica's step %.1f ms (reduction / step %.2f); raw TCP of the same bytes "
        "%.1f ms (reduction / raw TCP %.2f); CPU of all workers: reduction %.1f ms, raw TCP "
        "%.1f ms (%.2f)\n",
        replicas, reduction->bytes_sent * 1e-6,
        static_cast<int>((floats + worker::kReplicaSegmentFloats - 1) /
                         worker::kReplicaSegmentFloats) *
            worker::AllReduceRounds(replicas),
        ms, absl::ToDoubleMilliseconds(*step), ms / absl::ToDoubleMilliseconds(*step),
        absl::ToDoubleMilliseconds(tcp->wall), ms / absl::ToDoubleMilliseconds(tcp->wall),
        absl::ToDoubleMilliseconds(reduction->cpu), absl::ToDoubleMilliseconds(tcp->cpu),
        absl::ToDoubleMilliseconds(reduction->cpu) / absl::ToDoubleMilliseconds(tcp->cpu));
  }
  return 0;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pipetrain::Run();
}
