// Loopback (127.0.0.1) tests of PeerLink and ExchangeService: two endpoints in one process
// (fixture: link_test_fixture.h).
#include "server/link/peer_link.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/wire/frame_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/link/link_test_fixture.h"

namespace pipetrain::link::testing {
namespace {

using ::testing::HasSubstr;
using wire::TensorKey;
using wire::TensorKind;

TEST_F(LinkTest, ManyTensorsBothWays) {
  StartServer();
  std::unique_ptr<PeerLink> client = Connect();
  ASSERT_NE(client, nullptr);
  PeerLink* server = ServerLink(0);
  ASSERT_NE(server, nullptr);
  {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(hellos_[0].peer, "stage/0");
    EXPECT_EQ(hellos_[0].identity.job, kJob);
    EXPECT_EQ(hellos_[0].identity.generation, kGeneration);
  }

  // Activations up (client -> server), gradients down, interleaved; sizes from 4 bytes to 3 MiB
  // (fragmented) so frames of both kinds and credit grants cross in both directions.
  constexpr int kCount = 120;
  std::map<TensorKey, std::shared_ptr<const math::Matrix>> up, down;
  for (int i = 0; i < kCount; ++i) {
    const int64_t rows = 1 + (i * 37) % 300;
    const int64_t cols = (i % 20 == 7) ? 2600 : 1 + (i * 53) % 500;
    TensorKey a{i / 10, i, 1, TensorKind::kActivation};
    TensorKey g{i / 10, i, 0, TensorKind::kGradient};
    up[a] = Pattern(rows, cols, 2 * i);
    down[g] = Pattern(cols, rows, 2 * i + 1);
    ASSERT_TRUE(client->Send(a, up[a]).ok());
    ASSERT_TRUE(server->Send(g, down[g]).ok());
  }
  ASSERT_TRUE(server_collector_.WaitForTensors(kCount));
  ASSERT_TRUE(client_collector_.WaitForTensors(kCount));
  auto at_server = server_collector_.received();
  auto at_client = client_collector_.received();
  ASSERT_EQ(at_server.size(), up.size());
  ASSERT_EQ(at_client.size(), down.size());
  for (const auto& [key, tensor] : up) EXPECT_TRUE(BitwiseEqual(at_server.at(key), *tensor));
  for (const auto& [key, tensor] : down) EXPECT_TRUE(BitwiseEqual(at_client.at(key), *tensor));

  const LinkStats c = client->stats();
  const LinkStats s = server->stats();
  EXPECT_EQ(c.tensors_sent, kCount);
  EXPECT_EQ(c.tensors_received, kCount);
  EXPECT_EQ(c.bytes_sent, s.bytes_received);
  EXPECT_EQ(s.bytes_sent, c.bytes_received);
  EXPECT_LE(c.peak_in_flight, LinkOptions().window_bytes);
  EXPECT_LE(s.peak_in_flight, LinkOptions().window_bytes);
  EXPECT_EQ(client_collector_.error_count(), 0u);
  EXPECT_EQ(server_collector_.error_count(), 0u);

  client->Shutdown();
  EXPECT_TRUE(WaitClosed(client.get()));
  EXPECT_EQ(server_collector_.WaitForError().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(client_collector_.error_count(), 0u);  // a local shutdown is not an error.
  EXPECT_EQ(client->Send(TensorKey{0, 0, 1, TensorKind::kActivation}, Pattern(1, 1, 0)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(LinkTest, CreditWindowBoundsTheSender) {
  LinkOptions options;
  options.window_bytes = wire::kMaxFragmentBytes;  // 4 MiB: four 1 MiB tensors.
  options.fragment_bytes = wire::kMinFragmentBytes;
  absl::Notification gate;
  server_collector_.SetGate(&gate);  // the receiver holds its first tensor until released.
  StartServer(options);
  std::unique_ptr<PeerLink> client = Connect(options);
  ASSERT_NE(client, nullptr);

  constexpr int kCount = 12;
  constexpr int64_t kTensorBytes = 256 * 1024 * 4;  // 1 MiB.
  for (int i = 0; i < kCount; ++i) {
    ASSERT_TRUE(
        client->Send(TensorKey{0, i, 1, TensorKind::kActivation}, Pattern(256, 1024, i)).ok());
  }
  // The sender stops once it has used the receiver's whole window...
  ASSERT_TRUE(client->WaitFor(
      [](const LinkStats& s) { return s.blocked_on_credit && s.credit_bytes == 0; }, kTimeout));
  LinkStats stalled = client->stats();
  EXPECT_EQ(stalled.bytes_sent, options.window_bytes);
  EXPECT_EQ(stalled.tensors_sent, options.window_bytes / kTensorBytes);
  EXPECT_EQ(stalled.queued_tensors, kCount - options.window_bytes / kTensorBytes);
  EXPECT_EQ(stalled.credit_granted, options.window_bytes);  // nothing came back yet.
  EXPECT_TRUE(server_collector_.received().empty());
  // ...and resumes when the receiver drains.
  gate.Notify();
  ASSERT_TRUE(server_collector_.WaitForTensors(kCount));
  // Written out: nothing queued, and gRPC reported the last write done (what a worker waits for
  // before its StepDone, WorkerJob::FlushPeerLinks).
  ASSERT_TRUE(client->WaitFor(
      [](const LinkStats& s) { return s.queued_tensors == 0 && !s.writing; }, kTimeout));
  const LinkStats done = client->stats();
  EXPECT_FALSE(done.writing);
  EXPECT_EQ(done.bytes_sent, kCount * kTensorBytes);
  EXPECT_LE(done.peak_in_flight, options.window_bytes);
  EXPECT_GE(done.credit_stalls, 1);
  EXPECT_EQ(server_collector_.error_count(), 0u);
}

TEST_F(LinkTest, LargeTensorLargerThanTheWindowStreamsThrough) {
  LinkOptions options;
  options.window_bytes = wire::kMaxFragmentBytes;
  options.fragment_bytes = wire::kMaxFragmentBytes;
  StartServer(options);
  std::unique_ptr<PeerLink> client = Connect(options);
  ASSERT_NE(client, nullptr);
  auto big = Pattern(1024, 4099, 5);  // ~16 MiB, 5 fragments of <= 4 MiB, window 4 MiB.
  const TensorKey key{2, 3, 1, TensorKind::kActivation};
  ASSERT_TRUE(client->Send(key, big).ok());
  ASSERT_TRUE(server_collector_.WaitForTensors(1));
  EXPECT_TRUE(BitwiseEqual(server_collector_.received().at(key), *big));
}

// Each tensor is reported once by each end (on_transfer): the sender's from Send() to the
// completed write of its last fragment, the receiver's from its first fragment to its last
// (before on_tensor: the tensor is not in the collector yet when its report is),
// with its key and byte count; a tensor of several fragments takes time on both sides.
TEST_F(LinkTest, TransfersAreReportedByBothEnds) {
  LinkOptions options;
  options.fragment_bytes = wire::kMinFragmentBytes;
  StartServer(options);
  std::unique_ptr<PeerLink> client = Connect(options);
  ASSERT_NE(client, nullptr);
  auto big = Pattern(1024, 1024, 7);  // 4 MiB: 4 fragments of 1 MiB.
  auto small = Pattern(2, 3, 8);
  const TensorKey big_key{5, 1, 1, TensorKind::kActivation};
  const TensorKey small_key{5, 2, 1, TensorKind::kActivation};
  const auto before = LinkTransfer::Clock::now();
  ASSERT_TRUE(client->Send(big_key, big).ok());
  ASSERT_TRUE(client->Send(small_key, small).ok());
  const std::vector<LinkTransfer> sent = client_collector_.WaitForTransfers(2);
  const std::vector<LinkTransfer> received = server_collector_.WaitForTransfers(2);
  ASSERT_EQ(sent.size(), 2u);
  ASSERT_EQ(received.size(), 2u);
  const auto after = LinkTransfer::Clock::now();
  const std::vector<TensorKey> keys = {big_key, small_key};
  const std::vector<int64_t> bytes = {int64_t{4} << 20, 6 * 4};
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(sent[i].direction, LinkTransfer::Direction::kSend);
    EXPECT_EQ(received[i].direction, LinkTransfer::Direction::kReceive);
    EXPECT_EQ(sent[i].key, keys[i]);
    EXPECT_EQ(received[i].key, keys[i]);
    EXPECT_EQ(sent[i].bytes, bytes[i]);
    EXPECT_EQ(received[i].bytes, bytes[i]);
    for (const LinkTransfer& t : {sent[i], received[i]}) {
      EXPECT_LE(before, t.start);
      EXPECT_LE(t.start, t.end);
      EXPECT_LE(t.end, after);
    }
  }
  EXPECT_LT(received[0].start, received[0].end) << "4 fragments arrive one after another";
  EXPECT_LE(received[0].end, received[1].start) << "one tensor at a time per stream";
  EXPECT_EQ(server_collector_.reported_after_delivery(), 0);
  // No more: exactly one report per tensor and side.
  EXPECT_EQ(client_collector_.WaitForTransfers(0).size(), 2u);
}

TEST_F(LinkTest, BadFrameIsInvalidArgumentOnThatStreamOnly) {
  StartServer();
  // Garbage bytes.
  RawClient garbage(Address(), kGeneration, {std::string("\xff\xff\xff\xff\x01", 5)});
  grpc::Status status = garbage.Wait();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_EQ(server_collector_.WaitForError().code(), absl::StatusCode::kInvalidArgument);

  // A well-formed frame with an impossible shape.
  auto tensor = Pattern(2, 2, 1);
  grpc::ByteBuffer encoded;
  ASSERT_TRUE(wire::EncodeFragment({kJob, kGeneration}, TensorKey{0, 0, 0, TensorKind::kActivation},
                                   tensor, 0, 16, &encoded)
                  .ok());  // activation of chunk 0 is not a thing.
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(encoded.Dump(&slices).ok());
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  RawClient bad_chunk(Address(), kGeneration, {bytes});
  status = bad_chunk.Wait();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("cannot name chunk 0"));

  // The server still serves well-behaved peers.
  std::unique_ptr<PeerLink> client = Connect();
  ASSERT_NE(client, nullptr);
  const TensorKey key{1, 1, 1, TensorKind::kActivation};
  ASSERT_TRUE(client->Send(key, Pattern(3, 3, 3)).ok());
  ASSERT_TRUE(server_collector_.WaitForTensors(1));
}

TEST_F(LinkTest, StaleGenerationFrameIsAborted) {
  StartServer(
      {}, Validation(/*generation=*/kGeneration + 1));  // the server moved on to a new generation.
  std::unique_ptr<PeerLink> client = Connect({}, /*generation=*/kGeneration);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Send(TensorKey{0, 0, 1, TensorKind::kActivation}, Pattern(4, 4, 4)).ok());
  const absl::Status at_client = client_collector_.WaitForError();
  EXPECT_EQ(at_client.code(), absl::StatusCode::kAborted) << at_client;
  EXPECT_THAT(std::string(at_client.message()), HasSubstr("stale frame"));
  EXPECT_EQ(server_collector_.WaitForError().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(client->status().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(server_collector_.received().empty());
  EXPECT_TRUE(WaitClosed(client.get()));
}

TEST_F(LinkTest, RejectedHelloReachesTheClient) {
  StartServer();
  {
    absl::MutexLock lock(&mu_);
    reject_ = absl::AbortedError("generation 4 is stale, the job is at generation 5");
  }
  std::unique_ptr<PeerLink> client = Connect();
  ASSERT_NE(client, nullptr);
  const absl::Status status = client_collector_.WaitForError();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(status.message()), HasSubstr("generation 4 is stale"));
}

TEST_F(LinkTest, ServerShutdownFiresTheClientErrorCallback) {
  StartServer();
  std::unique_ptr<PeerLink> client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_NE(ServerLink(0), nullptr);
  server_->Shutdown();
  const absl::Status status = client_collector_.WaitForError();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_TRUE(WaitClosed(client.get()));
  EXPECT_FALSE(client->Send(TensorKey{0, 0, 1, TensorKind::kActivation}, Pattern(1, 1, 1)).ok());
}

TEST_F(LinkTest, ServerLinkShutdownFiresTheClientErrorCallback) {
  StartServer();
  std::unique_ptr<PeerLink> client = Connect();
  ASSERT_NE(client, nullptr);
  PeerLink* server = ServerLink(0);
  ASSERT_NE(server, nullptr);
  server->Shutdown();
  const absl::Status status = client_collector_.WaitForError();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("shut the Exchange link down"));
  EXPECT_EQ(server_collector_.error_count(), 0u);
}

TEST_F(LinkTest, ConnectingToNobodyIsUnavailable) {
  StartServer();
  const std::string address = Address();
  server_->Shutdown();  // the port is now closed.
  auto link =
      PeerLink::Connect(CreateExchangeChannel(address), address, Hello("stage/0", kGeneration),
                        LinkOptions(), LinkSettings{Validation(), client_collector_.Callbacks()});
  ASSERT_TRUE(link.ok());
  EXPECT_EQ(client_collector_.WaitForError().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(WaitClosed(link->get()));
}

TEST_F(LinkTest, ReceiverRefusalClosesTheStream) {
  StartServer();
  server_collector_.SetReply(absl::FailedPreconditionError("duplicate key"));
  std::unique_ptr<PeerLink> client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Send(TensorKey{0, 0, 1, TensorKind::kActivation}, Pattern(2, 2, 2)).ok());
  EXPECT_EQ(server_collector_.WaitForError().code(), absl::StatusCode::kFailedPrecondition);
  const absl::Status at_client = client_collector_.WaitForError();
  EXPECT_EQ(at_client.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(at_client.message()), HasSubstr("duplicate key"));
}

TEST(PeerLinkOptionsTest, BadArgumentsAreRejected) {
  LinkOptions options;
  options.fragment_bytes = 1000;
  EXPECT_EQ(options.Check().code(), absl::StatusCode::kInvalidArgument);
  options = LinkOptions();
  options.window_bytes = 1 << 20;
  EXPECT_EQ(options.Check().code(), absl::StatusCode::kInvalidArgument);
  auto channel = CreateExchangeChannel("127.0.0.1:1");
  LinkSettings no_callback{Validation(), {}};
  EXPECT_EQ(PeerLink::Connect(channel, "x", Hello("s", kGeneration), LinkOptions(), no_callback)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ExchangeService::Create(LinkOptions(), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(LinkTest, SendRejectsBadTensors) {
  StartServer();
  std::unique_ptr<PeerLink> client = Connect();
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->Send(TensorKey{0, 0, 1, TensorKind::kActivation}, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      client
          ->Send(TensorKey{0, 0, 1, TensorKind::kActivation}, std::make_shared<math::Matrix>(0, 4))
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->Send(TensorKey{-1, 0, 1, TensorKind::kActivation}, Pattern(1, 1, 1)).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain::link::testing
