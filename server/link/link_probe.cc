#include "server/link/link_probe.h"

#include <grpcpp/grpcpp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "common/wire/tensor_key.h"
#include "server/link/exchange_service.h"

namespace pipetrain::link {
namespace {

using wire::TensorKey;
using wire::TensorKind;

constexpr int kUnmeasuredRoundTrips = 8;
constexpr int64_t kBulkCols = 1024;  // a bulk tensor of B bytes is [B / 4 KiB, 1024] floats.
constexpr int64_t kMaxProbeTensorBytes = int64_t{64} << 20;

// Frames of a probe stream: activations of chunk 1 towards the answerer, gradients of chunk 0
// (the answers) back, steps numbering the tensors.
wire::FrameValidation ProbeValidation(TensorKind kind, int64_t max_tensor_bytes) {
  wire::FrameValidation v;
  v.expected = wire::StreamIdentity{kLinkProbeJob, kLinkProbeGeneration};
  v.num_microbatches = 1;
  v.num_chunks = 2;
  v.allowed_kinds = wire::KindBit(kind);
  v.max_tensor_bytes = max_tensor_bytes;
  return v;
}

// CPU seconds this process has used.
double CpuSecondsOfProcess() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double MedianOf(std::vector<double> values) {
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The dialling end: sends numbered tensors and waits for their answers, within one deadline.
class ProbeSender {
 public:
  ProbeSender(PeerLink* link, absl::Time deadline, absl::Duration timeout)
      : link_(link), deadline_(deadline), timeout_(timeout) {}

  // What the messages call the link.
  std::string Name() const { return absl::StrCat("the link to ", link_->peer()); }

  // Queues `tensor` as the next numbered tensor.
  absl::Status Send(std::shared_ptr<const math::Matrix> tensor) {
    const absl::Status sent =
        link_->Send(TensorKey{sent_++, 0, 1, TensorKind::kActivation}, std::move(tensor));
    if (sent.ok()) return sent;
    return absl::UnavailableError(absl::StrCat("link probe: sending tensor ", sent_ - 1, " on ",
                                               Name(), " failed: ", sent.message()));
  }

  // Waits until every tensor sent so far has been answered, within the deadline (checked
  // before waiting, so that a deadline already passed fails whatever the link does).
  absl::Status AwaitAnswers() {
    const int64_t want = sent_;
    const bool answered =
        absl::Now() < deadline_ &&
        link_->WaitFor(
            [want](const LinkStats& s) { return s.tensors_received >= want || s.closed; },
            deadline_ - absl::Now());
    if (const absl::Status failed = link_->status(); !failed.ok()) {
      return absl::Status(failed.code(),
                          absl::StrCat("link probe: ", Name(), " failed: ", failed.message()));
    }
    if (answered) return absl::OkStatus();
    return absl::DeadlineExceededError(
        absl::StrCat("link probe: out of time (", absl::FormatDuration(timeout_),
                     ") waiting for the answer to tensor ", want - 1, " on ", Name()));
  }

 private:
  PeerLink* const link_;
  const absl::Time deadline_;
  const absl::Duration timeout_;
  int64_t sent_ = 0;
};

// Small round trips: the unmeasured ones, then the measured ones' latency and CPU per tensor end;
// `ends`: the tensor ends per round trip this process has (4 with both ends in it, else 2).
absl::Status MeasureRoundTrips(const LinkProbeOptions& o, int ends, ProbeSender* sender,
                               LinkMeasurement* m) {
  auto small = std::make_shared<const math::Matrix>(math::Matrix::Zero(1, o.small_bytes / 4));
  std::vector<double> round_trips;
  double cpu_start = 0;
  for (int r = 0; r < kUnmeasuredRoundTrips + o.round_trips; ++r) {
    if (r == kUnmeasuredRoundTrips) cpu_start = CpuSecondsOfProcess();
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = sender->Send(small);
    if (s.ok()) s = sender->AwaitAnswers();
    if (!s.ok()) return s;
    if (r >= kUnmeasuredRoundTrips) round_trips.push_back(SecondsSince(start));
  }
  const double cpu = CpuSecondsOfProcess() - cpu_start;
  m->round_trips = o.round_trips;
  m->latency_seconds = MedianOf(round_trips) / 2;
  m->cpu_seconds_per_message = cpu / (static_cast<double>(ends) * o.round_trips);
  return absl::OkStatus();
}

// Bulk runs: each queues options.bulk_tensors at once and waits for the last answer.
absl::Status MeasureBulk(const LinkProbeOptions& o, ProbeSender* sender, LinkMeasurement* m) {
  auto bulk = std::make_shared<const math::Matrix>(
      math::Matrix::Constant(o.bulk_bytes / (4 * kBulkCols), kBulkCols, 1.0f));
  absl::Status s = sender->Send(bulk);  // unmeasured: the first touch of the receive buffers.
  if (s.ok()) s = sender->AwaitAnswers();
  std::vector<double> rates;
  const double run_bytes = static_cast<double>(o.bulk_bytes) * o.bulk_tensors;
  for (int run = 0; run < o.bulk_runs && s.ok(); ++run) {
    const auto start = std::chrono::steady_clock::now();
    for (int t = 0; t < o.bulk_tensors && s.ok(); ++t) s = sender->Send(bulk);
    if (s.ok()) s = sender->AwaitAnswers();
    const double seconds = SecondsSince(start);
    // The run's last answer came a round trip after its bytes: take that out, but never more
    // than half of the run (a round trip that was slow for other reasons).
    rates.push_back(run_bytes / std::max(seconds - 2 * m->latency_seconds, seconds / 2));
  }
  if (!s.ok()) return s;
  m->bytes_per_second = *std::max_element(rates.begin(), rates.end());
  m->bulk_bytes = static_cast<int64_t>(run_bytes) * o.bulk_runs;
  return absl::OkStatus();
}

absl::Status CheckFigures(const LinkMeasurement& m) {
  for (const double x : {m.latency_seconds, m.bytes_per_second, m.cpu_seconds_per_message}) {
    if (!(std::isfinite(x) && x > 0)) {
      return absl::InternalError(absl::StrCat(
          "link probe: a figure is not positive and finite (latency ", m.latency_seconds,
          " s, bandwidth ", m.bytes_per_second, " B/s, CPU ", m.cpu_seconds_per_message,
          " s per message); the clock's resolution is too coarse"));
    }
  }
  return absl::OkStatus();
}

// The probe proper, on a dialled `link` (tears nothing down).
absl::StatusOr<LinkMeasurement> RunProbe(const LinkProbeOptions& o, int ends, PeerLink* link) {
  ProbeSender sender(link, absl::Now() + o.timeout, o.timeout);
  LinkMeasurement m;
  absl::Status s = MeasureRoundTrips(o, ends, &sender, &m);
  if (s.ok()) s = MeasureBulk(o, &sender, &m);
  if (s.ok()) s = CheckFigures(m);
  if (!s.ok()) return s;
  return m;
}

absl::Status CheckRange(const char* field, int64_t value, int64_t low, int64_t high,
                        int64_t multiple) {
  if (value >= low && value <= high && value % multiple == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "LinkProbeOptions.", field, " must be in [", low, ", ", high, "]",
      multiple > 1 ? absl::StrCat(" and a multiple of ", multiple) : "", ", got ", value));
}

// Dials a probe stream on `channel` and measures it (see MeasurePeerLink); `ends` as for
// MeasureRoundTrips.
absl::StatusOr<LinkMeasurement> DialAndMeasure(std::shared_ptr<grpc::Channel> channel,
                                               const std::string& peer,
                                               const std::string& hello_peer,
                                               const LinkProbeOptions& o, int ends) {
  PT_RETURN_IF_ERROR(o.Check());
  const PeerHello hello{hello_peer, wire::StreamIdentity{kLinkProbeJob, kLinkProbeGeneration}, ""};
  LinkCallbacks callbacks;
  callbacks.on_tensor = [](const TensorKey&, math::Matrix) { return absl::OkStatus(); };
  PT_ASSIGN_OR_RETURN(
      std::unique_ptr<PeerLink> link,
      PeerLink::Connect(std::move(channel), peer, hello, o.link,
                        LinkSettings{ProbeValidation(TensorKind::kGradient, kProbeAnswerBytes),
                                     std::move(callbacks)}));
  absl::StatusOr<LinkMeasurement> measured = RunProbe(o, ends, link.get());
  link->Shutdown();
  return measured;
}

}  // namespace

absl::Status LinkProbeOptions::Check() const {
  absl::Status s = CheckRange("round_trips", round_trips, 4, 10000, 1);
  if (s.ok()) s = CheckRange("small_bytes", small_bytes, 4, int64_t{64} << 10, 4);
  if (s.ok()) {
    s = CheckRange("bulk_bytes", bulk_bytes, int64_t{64} << 10, kMaxProbeTensorBytes, 4096);
  }
  if (s.ok()) s = CheckRange("bulk_tensors", bulk_tensors, 1, 1024, 1);
  if (s.ok()) s = CheckRange("bulk_runs", bulk_runs, 1, 100, 1);
  if (s.ok() && !(timeout > absl::ZeroDuration() && timeout <= absl::Hours(1))) {
    s = absl::InvalidArgumentError(absl::StrCat("LinkProbeOptions.timeout must be in (0, 1h], got ",
                                                absl::FormatDuration(timeout)));
  }
  if (s.ok()) s = link.Check();
  return s;
}

ProbeAnswerer::ProbeAnswerer()
    : answer_(std::make_shared<const math::Matrix>(
          math::Matrix::Zero(1, kProbeAnswerBytes / static_cast<int64_t>(sizeof(float))))) {}

ProbeAnswerer::~ProbeAnswerer() { Shutdown(); }

absl::StatusOr<LinkSettings> ProbeAnswerer::Accept(const PeerHello& hello,
                                                   std::unique_ptr<PeerLink> link) {
  if (hello.identity.job != kLinkProbeJob || hello.identity.generation != kLinkProbeGeneration) {
    return absl::InvalidArgumentError(
        absl::StrCat("a probe stream from '", hello.peer, "' names job '", hello.identity.job,
                     "' generation ", hello.identity.generation, "; probe streams name '",
                     kLinkProbeJob, "' generation ", kLinkProbeGeneration));
  }
  absl::MutexLock lock(&mu_);
  // Streams that ended deliver nothing any more: their links go now, outside their callbacks.
  links_.erase(std::remove_if(links_.begin(), links_.end(),
                              [](const std::unique_ptr<PeerLink>& l) { return l->stats().closed; }),
               links_.end());
  if (links_.size() >= static_cast<size_t>(kMaxProbeStreams)) {
    return absl::ResourceExhaustedError(absl::StrCat("probe stream from '", hello.peer,
                                                     "' refused: ", kMaxProbeStreams,
                                                     " probe streams are open"));
  }
  links_.push_back(std::move(link));
  PeerLink* const raw = links_.back().get();
  LinkCallbacks callbacks;
  callbacks.on_tensor = [this, raw](const TensorKey& key, math::Matrix /*tensor*/) {
    return raw->Send(TensorKey{key.step, 0, 0, TensorKind::kGradient}, answer_);
  };
  return LinkSettings{ProbeValidation(TensorKind::kActivation, kMaxProbeTensorBytes),
                      std::move(callbacks)};
}

void ProbeAnswerer::Shutdown() {
  absl::MutexLock lock(&mu_);
  for (const std::unique_ptr<PeerLink>& link : links_) link->Shutdown();
}

absl::StatusOr<LinkMeasurement> MeasurePeerLink(std::shared_ptr<grpc::Channel> channel,
                                                const std::string& peer,
                                                const std::string& hello_peer,
                                                const LinkProbeOptions& options) {
  if (channel == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("link probe: no channel to ", peer));
  }
  return DialAndMeasure(std::move(channel), peer, hello_peer, options, /*ends=*/2);
}

absl::StatusOr<LinkMeasurement> MeasureLoopbackLink(const LinkProbeOptions& o) {
  PT_RETURN_IF_ERROR(o.Check());
  ProbeAnswerer answerer;
  PT_ASSIGN_OR_RETURN(std::unique_ptr<ExchangeService> service,
                      ExchangeService::Create(o.link, [&answerer](const PeerHello& hello,
                                                                  std::unique_ptr<PeerLink> link) {
                        return answerer.Accept(hello, std::move(link));
                      }));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  service->RegisterOn(&builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port <= 0) {
    return absl::UnavailableError("link probe: could not listen on 127.0.0.1 (an ephemeral port)");
  }
  const std::string address = absl::StrCat("127.0.0.1:", port);
  absl::StatusOr<LinkMeasurement> measured =
      DialAndMeasure(CreateExchangeChannel(address), absl::StrCat("loopback ", address),
                     "link-probe", o, /*ends=*/4);
  answerer.Shutdown();
  server->Shutdown(std::chrono::system_clock::now());
  return measured;
}

}  // namespace pipetrain::link
