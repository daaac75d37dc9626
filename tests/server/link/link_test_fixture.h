// The loopback (127.0.0.1) fixture of the link tests (peer_link_test, stripe_group_test): a
// server with an ExchangeService and clients in one process, and collectors of what each end
// receives. Synchronisation is by waiting on conditions (absl::Mutex::AwaitWithTimeout,
// PeerLink::WaitFor, absl::Notification), never by sleeping; the timeouts only bound a failing
// test.
#ifndef PIPETRAIN_TESTS_SERVER_LINK_LINK_TEST_FIXTURE_H_
#define PIPETRAIN_TESTS_SERVER_LINK_LINK_TEST_FIXTURE_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_callback.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/wire/frame_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/link/exchange_service.h"
#include "server/link/peer_link.h"
#include "tests/server/link/loopback_server.h"

namespace pipetrain::link::testing {

using wire::TensorKey;
using wire::TensorKind;

inline constexpr absl::Duration kTimeout = absl::Seconds(30);
inline constexpr char kJob[] = "job-1";
inline constexpr int64_t kGeneration = 4;
inline constexpr int kMicrobatches = 1000;
inline constexpr int kChunks = 4;

// The hello of a dialler named `peer` for (kJob, generation), without a link secret.
inline PeerHello Hello(const std::string& peer, int64_t generation) {
  PeerHello hello;
  hello.peer = peer;
  hello.identity = wire::StreamIdentity{kJob, generation};
  return hello;
}

inline wire::FrameValidation Validation(int64_t generation = kGeneration) {
  wire::FrameValidation v;
  v.expected = wire::StreamIdentity{kJob, generation};
  v.num_microbatches = kMicrobatches;
  v.num_chunks = kChunks;
  return v;
}

inline std::shared_ptr<const math::Matrix> Pattern(int64_t rows, int64_t cols, uint32_t seed) {
  auto m = std::make_shared<math::Matrix>(rows, cols);
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < m->size(); ++i) {
    const uint32_t bits = rng();
    std::memcpy(m->data() + i, &bits, sizeof(bits));
  }
  return m;
}

inline bool BitwiseEqual(const math::Matrix& a, const math::Matrix& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Collects what one endpoint receives and the errors it reports. Thread-safe.
class Collector {
 public:
  LinkCallbacks Callbacks() {
    LinkCallbacks callbacks;
    callbacks.on_tensor = [this](const TensorKey& key, math::Matrix tensor) {
      if (gate_ != nullptr) gate_->WaitForNotification();  // a deliberately slow receiver.
      absl::MutexLock lock(&mu_);
      if (!reply_.ok()) return reply_;
      received_.emplace(key, std::move(tensor));
      return absl::OkStatus();
    };
    callbacks.on_error = [this](const absl::Status& status) {
      absl::MutexLock lock(&mu_);
      errors_.push_back(status);
    };
    callbacks.on_transfer = [this](const LinkTransfer& transfer) {
      absl::MutexLock lock(&mu_);
      transfers_.push_back(transfer);
      if (transfer.direction == LinkTransfer::Direction::kReceive &&
          received_.count(transfer.key) > 0) {
        ++reported_after_delivery_;
      }
    };
    return callbacks;
  }

  // The first `n` transfers reported, waiting for them; fewer if they do not come in time.
  std::vector<LinkTransfer> WaitForTransfers(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return transfers_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), kTimeout);
    return transfers_;
  }

  // Makes on_tensor wait for `gate` before storing (tests of the credit window only).
  void SetGate(absl::Notification* gate) { gate_ = gate; }
  // Makes on_tensor fail with `status`.
  void SetReply(absl::Status status) {
    absl::MutexLock lock(&mu_);
    reply_ = std::move(status);
  }

  bool WaitForTensors(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return received_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), kTimeout);
  }

  // The first error reported, waiting for one; DEADLINE_EXCEEDED if none comes.
  absl::Status WaitForError() {
    absl::MutexLock lock(&mu_);
    auto any = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !errors_.empty(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&any), kTimeout)) {
      return absl::DeadlineExceededError("no error reported");
    }
    return errors_.front();
  }

  // Receive reports that came after on_tensor had stored the tensor (there should be none).
  int reported_after_delivery() {
    absl::MutexLock lock(&mu_);
    return reported_after_delivery_;
  }

  std::map<TensorKey, math::Matrix> received() {
    absl::MutexLock lock(&mu_);
    return received_;
  }
  size_t error_count() {
    absl::MutexLock lock(&mu_);
    return errors_.size();
  }

 private:
  absl::Notification* gate_ = nullptr;  // set before the link starts.
  absl::Mutex mu_;                      // protects everything below.
  std::map<TensorKey, math::Matrix> received_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> errors_ ABSL_GUARDED_BY(mu_);
  std::vector<LinkTransfer> transfers_ ABSL_GUARDED_BY(mu_);
  int reported_after_delivery_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status reply_ ABSL_GUARDED_BY(mu_);
};

// A loopback server with an ExchangeService whose accept callback keeps the server-side links
// and receives into `collector`.
class LinkTest : public ::testing::Test {
 protected:
  void StartServer(LinkOptions options = {}, wire::FrameValidation validation = Validation()) {
    server_ = std::make_unique<LoopbackServer>(
        [this, validation](const PeerHello& hello,
                           std::unique_ptr<PeerLink> link) -> absl::StatusOr<LinkSettings> {
          absl::MutexLock lock(&mu_);
          if (!reject_.ok()) return reject_;
          hellos_.push_back(hello);
          server_links_.push_back(std::move(link));
          return LinkSettings{validation, server_collector_.Callbacks()};
        },
        options);
    ASSERT_TRUE(server_->serving());
    ASSERT_GT(server_->port(), 0);
  }

  std::string Address() const { return server_->Address(); }

  std::unique_ptr<PeerLink> Connect(LinkOptions options = {}, int64_t generation = kGeneration,
                                    wire::FrameValidation validation = Validation()) {
    auto link =
        PeerLink::Connect(CreateExchangeChannel(Address()), Address(), Hello("stage/0", generation),
                          options, LinkSettings{validation, client_collector_.Callbacks()});
    EXPECT_TRUE(link.ok()) << link.status();
    return link.ok() ? *std::move(link) : nullptr;
  }

  // A link of `connections` stripes (CreateExchangeChannels) from "stage/0".
  std::unique_ptr<PeerLink> ConnectStriped(int connections, LinkOptions options = {}) {
    auto link = PeerLink::Connect(CreateExchangeChannels(Address(), connections), Address(),
                                  Hello("stage/0", kGeneration), options,
                                  LinkSettings{Validation(), client_collector_.Callbacks()});
    EXPECT_TRUE(link.ok()) << link.status();
    return link.ok() ? *std::move(link) : nullptr;
  }

  // The i-th accepted server-side link, waiting for it.
  PeerLink* ServerLink(size_t i) {
    absl::MutexLock lock(&mu_);
    auto accepted = [this, i]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return server_links_.size() > i; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&accepted), kTimeout)) return nullptr;
    return server_links_[i].get();
  }

  void TearDown() override {
    {
      absl::MutexLock lock(&mu_);
      for (auto& link : server_links_) link->Shutdown();
    }
    server_.reset();
  }

  // Destroyed last: callbacks of every link refer to them.
  Collector client_collector_;
  Collector server_collector_;

  std::unique_ptr<LoopbackServer> server_;

  absl::Mutex mu_;  // protects the accept callback's state.
  std::vector<PeerHello> hellos_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<PeerLink>> server_links_ ABSL_GUARDED_BY(mu_);
  absl::Status reject_ ABSL_GUARDED_BY(mu_);
};

inline bool WaitClosed(PeerLink* link) {
  return link->WaitFor([](const LinkStats& s) { return s.closed; }, kTimeout);
}

// A bare generic client that writes raw buffers, for feeding the server malformed frames.
class RawClient final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // `metadata`: more call metadata (e.g. the stripe handshake's).
  RawClient(const std::string& address, int64_t generation, std::vector<std::string> messages,
            const std::vector<std::pair<std::string, std::string>>& metadata = {})
      : stub_(CreateExchangeChannel(address)), messages_(std::move(messages)) {
    context_.AddMetadata("pipetrain-peer-bin", "raw");
    context_.AddMetadata("pipetrain-job-bin", kJob);
    context_.AddMetadata("pipetrain-generation", absl::StrCat(generation));
    for (const auto& [key, value] : metadata) context_.AddMetadata(key, value);
    stub_.PrepareBidiStreamingCall(&context_, kExchangeMethod, grpc::StubOptions(), this);
    StartRead(&read_);
    WriteNext();
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (!read_one_.HasBeenNotified()) read_one_.Notify();
    StartRead(&read_);
  }

  // Whether a message (e.g. the server's first credit grant: the server started the stream)
  // arrived, waiting for one.
  bool WaitForRead() { return read_one_.WaitForNotificationWithTimeout(kTimeout); }
  void OnWriteDone(bool ok) override {
    if (ok) WriteNext();
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_.Notify();
  }

  // A reactor must outlive its call: ends it (if a test left it running) and waits for OnDone.
  ~RawClient() override {
    if (done_.HasBeenNotified()) return;
    context_.TryCancel();
    done_.WaitForNotificationWithTimeout(kTimeout);
  }

  // Cancels the call (its connection stays up).
  void Cancel() { context_.TryCancel(); }

  // The call's final status, waiting for it.
  grpc::Status Wait() {
    if (!done_.WaitForNotificationWithTimeout(kTimeout)) {
      context_.TryCancel();
      done_.WaitForNotification();
    }
    return status_;
  }

 private:
  // Called from the constructor and from OnWriteDone only: one write at a time.
  void WriteNext() {
    if (next_ == messages_.size()) return;
    grpc::Slice slice(messages_[next_++]);
    write_ = grpc::ByteBuffer(&slice, 1);
    StartWrite(&write_);
  }

  grpc::GenericStub stub_;
  grpc::ClientContext context_;
  std::vector<std::string> messages_;
  size_t next_ = 0;
  grpc::ByteBuffer read_;
  grpc::ByteBuffer write_;
  grpc::Status status_;
  absl::Notification read_one_;
  absl::Notification done_;
};

}  // namespace pipetrain::link::testing

#endif  // PIPETRAIN_TESTS_SERVER_LINK_LINK_TEST_FIXTURE_H_
