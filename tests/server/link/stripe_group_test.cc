// Loopback (127.0.0.1) tests of striped links: one PeerLink over several Exchange streams, each
// on its own TCP connection (server/link/stripe_group.h, stripe_registry.h; fixture:
// link_test_fixture.h).
#include "server/link/stripe_group.h"

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/link/stripe_registry.h"
#include "tests/integration/run_command.h"
#include "tests/server/link/link_test_fixture.h"

namespace pipetrain::link::testing {
namespace {

using ::testing::HasSubstr;
using wire::TensorKey;
using wire::TensorKind;

// Tensors of 4 B to 17 MiB both ways over a link of 4 connections, striped from 64 KiB (so in
// blocks of at least 64 KiB): each arrives once, bit-exact, and both ends report every tensor
// (one transfer per tensor, not per stripe).
TEST_F(LinkTest, StripedLinkMovesTensorsOfSeveralSizesBitExact) {
  LinkOptions options;
  options.stripe_min_bytes = 64 << 10;
  StartServer(options);
  std::unique_ptr<PeerLink> client = ConnectStriped(4, options);
  ASSERT_NE(client, nullptr);
  PeerLink* server = ServerLink(0);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(client->connections(), 4);
  EXPECT_EQ(server->connections(), 4);

  // [rows, cols]: 4 B, 1 KiB, 100 KiB, 1 MiB + 4 B (5 fragments' worth over 4 blocks of
  // unequal length), 5 MiB and 17 MiB (blocks of several fragments each).
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1},      {16, 16},     {100, 256},
                                                           {1, 262145}, {1280, 1024}, {4352, 1024}};
  std::map<TensorKey, std::shared_ptr<const math::Matrix>> up, down;
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const int mb = round * 10 + static_cast<int>(i);
      const TensorKey a{round, mb, 1, TensorKind::kActivation};
      const TensorKey g{round, mb, 0, TensorKind::kGradient};
      up[a] = Pattern(shapes[i].first, shapes[i].second, 2 * mb);
      down[g] = Pattern(shapes[i].second, shapes[i].first, 2 * mb + 1);
      ASSERT_TRUE(client->Send(a, up[a]).ok());
      ASSERT_TRUE(server->Send(g, down[g]).ok());
    }
  }
  ASSERT_TRUE(server_collector_.WaitForTensors(up.size()));
  ASSERT_TRUE(client_collector_.WaitForTensors(down.size()));
  const auto at_server = server_collector_.received();
  const auto at_client = client_collector_.received();
  ASSERT_EQ(at_server.size(), up.size());
  ASSERT_EQ(at_client.size(), down.size());
  for (const auto& [key, sent] : up) {
    ASSERT_EQ(at_server.count(key), 1u) << key.ToString();
    EXPECT_TRUE(BitwiseEqual(at_server.at(key), *sent)) << key.ToString();
  }
  for (const auto& [key, sent] : down) {
    ASSERT_EQ(at_client.count(key), 1u) << key.ToString();
    EXPECT_TRUE(BitwiseEqual(at_client.at(key), *sent)) << key.ToString();
  }
  // Each side: one report per tensor sent and per tensor received, with the tensor's bytes.
  const size_t reports = up.size() + down.size();
  std::vector<LinkTransfer> transfers = client_collector_.WaitForTransfers(reports);
  ASSERT_EQ(transfers.size(), reports);
  for (const LinkTransfer& t : transfers) {
    const auto& sent = t.direction == LinkTransfer::Direction::kSend ? up : down;
    ASSERT_EQ(sent.count(t.key), 1u) << t.key.ToString();
    EXPECT_EQ(t.bytes, static_cast<int64_t>(sent.at(t.key)->size() * sizeof(float)));
  }
  EXPECT_TRUE(client->WaitFor(
      [&](const LinkStats& s) { return s.tensors_sent == static_cast<int64_t>(up.size()); },
      kTimeout));
  const LinkStats stats = client->stats();
  EXPECT_EQ(stats.tensors_received, static_cast<int64_t>(down.size()));
  EXPECT_EQ(stats.queued_tensors, 0);
  EXPECT_EQ(stats.striped_sent, 3 * 3) << "every tensor of at least 2 blocks of 64 KiB was split";
  {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(hellos_.size(), 1u) << "the AcceptFn sees one link, not one per stripe";
  }
}

// Small tensors stay on the first connection: below the threshold a striped link sends exactly
// what a one-connection link sends.
TEST_F(LinkTest, TensorsBelowTheThresholdGoWholeOnTheFirstConnection) {
  StartServer();
  std::unique_ptr<PeerLink> client = ConnectStriped(3);  // threshold: the default 4 MiB.
  ASSERT_NE(client, nullptr);
  const TensorKey key{0, 0, 1, TensorKind::kActivation};
  auto tensor = Pattern(1024, 1023, 7);  // just under 4 MiB.
  ASSERT_TRUE(client->Send(key, tensor).ok());
  ASSERT_TRUE(server_collector_.WaitForTensors(1));
  EXPECT_TRUE(BitwiseEqual(server_collector_.received().at(key), *tensor));
  EXPECT_TRUE(client->WaitFor([](const LinkStats& s) { return s.tensors_sent == 1; }, kTimeout));
  EXPECT_EQ(client->stats().striped_sent, 0);
  // At the threshold, it is split.
  const TensorKey next{0, 1, 1, TensorKind::kActivation};
  auto large = Pattern(1024, 1024, 8);
  ASSERT_TRUE(client->Send(next, large).ok());
  ASSERT_TRUE(server_collector_.WaitForTensors(2));
  EXPECT_TRUE(BitwiseEqual(server_collector_.received().at(next), *large));
  EXPECT_TRUE(client->WaitFor([](const LinkStats& s) { return s.tensors_sent == 2; }, kTimeout));
  EXPECT_EQ(client->stats().striped_sent, 1);
}

// With round_robin_whole, tensors that are not split go whole to each connection in turn; they
// still arrive once each, bit-exact.
TEST_F(LinkTest, WholeTensorsRoundRobinOverTheConnections) {
  StartServer();
  LinkOptions options;
  options.round_robin_whole = true;
  std::unique_ptr<PeerLink> client = ConnectStriped(3, options);
  ASSERT_NE(client, nullptr);
  std::map<TensorKey, std::shared_ptr<const math::Matrix>> sent;
  for (int mb = 0; mb < 30; ++mb) {
    const TensorKey key{0, mb, 1, TensorKind::kActivation};
    sent[key] = Pattern(64 + mb, 300, mb);  // 75-110 KiB each, below the threshold: whole.
    ASSERT_TRUE(client->Send(key, sent[key]).ok());
  }
  ASSERT_TRUE(server_collector_.WaitForTensors(sent.size()));
  const auto received = server_collector_.received();
  ASSERT_EQ(received.size(), sent.size());
  for (const auto& [key, tensor] : sent) {
    EXPECT_TRUE(BitwiseEqual(received.at(key), *tensor)) << key.ToString();
  }
  EXPECT_EQ(client->stats().striped_sent, 0);
}

// Every stripe is its own TCP connection: `ss` counts 4 established connections to the server's
// port from this process's link.
TEST_F(LinkTest, EachStripeIsItsOwnTcpConnection) {
  StartServer();
  std::unique_ptr<PeerLink> client = ConnectStriped(4);
  ASSERT_NE(client, nullptr);
  ASSERT_NE(ServerLink(0), nullptr);
  // Every stripe carries its first credit grant once its stream is up.
  ASSERT_TRUE(client->WaitFor([](const LinkStats& s) { return s.credit_granted >= 4 * (8 << 20); },
                              kTimeout));
  const pipetrain::testing::CommandRun ss = pipetrain::testing::RunCommand(
      absl::StrCat("ss -tnH state established '( dport = :", server_->port(), " )' 2>&1"));
  ASSERT_EQ(ss.exit_code, 0) << ss.out;
  const std::vector<std::string> lines = absl::StrSplit(ss.out, '\n', absl::SkipEmpty());
  EXPECT_EQ(lines.size(), 4u) << ss.out;
}

// A stripe's connection lost is the link lost: both ends report UNAVAILABLE once, as an
// unstriped link does, and the other stripes are closed.
TEST_F(LinkTest, LosingOneStripeFailsTheWholeLinkAsUnavailable) {
  StartServer();
  const std::vector<std::pair<std::string, std::string>> stripe0 = {
      {internal::kStripeKey, "0/2"}, {internal::kLinkIdKey, "link-a"}};
  const std::vector<std::pair<std::string, std::string>> stripe1 = {
      {internal::kStripeKey, "1/2"}, {internal::kLinkIdKey, "link-a"}};
  RawClient first(Address(), kGeneration, {}, stripe0);
  RawClient second(Address(), kGeneration, {}, stripe1);
  PeerLink* server = ServerLink(0);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->connections(), 2);
  // Both stripes joined the link: the server granted credit on each.
  ASSERT_TRUE(first.WaitForRead());
  ASSERT_TRUE(second.WaitForRead());
  second.Cancel();
  EXPECT_EQ(server_collector_.WaitForError().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(server->status().code(), absl::StatusCode::kUnavailable);
  // The surviving stripe is closed by the server, which ends it with UNAVAILABLE.
  EXPECT_EQ(first.Wait().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(second.Wait().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(server_collector_.error_count(), 1u);
}

TEST_F(LinkTest, ServerShutdownFailsAStripedClientAsUnavailable) {
  StartServer();
  std::unique_ptr<PeerLink> client = ConnectStriped(3);
  ASSERT_NE(client, nullptr);
  ASSERT_NE(ServerLink(0), nullptr);
  ServerLink(0)->Shutdown();
  EXPECT_EQ(client_collector_.WaitForError().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(WaitClosed(client.get()));
  EXPECT_EQ(client_collector_.error_count(), 1u);
}

// Hostile or absurd stripe handshakes end the stream with a clear code; the server carries on.
TEST_F(LinkTest, BadStripeHandshakesAreRefused) {
  StartServer();
  struct Case {
    std::vector<std::pair<std::string, std::string>> metadata;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{internal::kStripeKey, "1/100"}, {internal::kLinkIdKey, "x"}},
       grpc::StatusCode::RESOURCE_EXHAUSTED,
       "more than the limit of 8"},
      {{{internal::kStripeKey, "4/4"}, {internal::kLinkIdKey, "x"}},
       grpc::StatusCode::INVALID_ARGUMENT,
       "bad pipetrain-stripe '4/4'"},
      {{{internal::kStripeKey, "-1/2"}, {internal::kLinkIdKey, "x"}},
       grpc::StatusCode::INVALID_ARGUMENT,
       "bad pipetrain-stripe"},
      {{{internal::kStripeKey, "99999999999999999999/2"}},
       grpc::StatusCode::INVALID_ARGUMENT,
       "bad pipetrain-stripe"},
      {{{internal::kStripeKey, "two"}}, grpc::StatusCode::INVALID_ARGUMENT, "bad pipetrain-stripe"},
      {{{internal::kStripeKey, "0/2"}},
       grpc::StatusCode::INVALID_ARGUMENT,
       "needs a pipetrain-link-id-bin"},
      {{{internal::kLinkIdKey, "x"}},
       grpc::StatusCode::INVALID_ARGUMENT,
       "without pipetrain-stripe"},
  };
  for (const Case& c : cases) {
    RawClient raw(Address(), kGeneration, {}, c.metadata);
    const grpc::Status status = raw.Wait();
    EXPECT_EQ(status.error_code(), c.code)
        << c.metadata[0].second << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.message));
  }
  {
    absl::MutexLock lock(&mu_);
    EXPECT_TRUE(hellos_.empty()) << "none of them reached the AcceptFn";
  }
  // A stripe index twice, and a stripe whose count differs from its link's first stripe.
  RawClient first(Address(), kGeneration, {},
                  {{internal::kStripeKey, "0/2"}, {internal::kLinkIdKey, "L"}});
  ASSERT_NE(ServerLink(0), nullptr);
  RawClient again(Address(), kGeneration, {},
                  {{internal::kStripeKey, "0/2"}, {internal::kLinkIdKey, "L"}});
  const grpc::Status twice = again.Wait();
  EXPECT_EQ(twice.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << twice.error_message();
  EXPECT_THAT(twice.error_message(), HasSubstr("arrived already"));
  RawClient other(Address(), kGeneration, {},
                  {{internal::kStripeKey, "1/3"}, {internal::kLinkIdKey, "L"}});
  const grpc::Status mismatch = other.Wait();
  EXPECT_EQ(mismatch.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << mismatch.error_message();
  EXPECT_THAT(mismatch.error_message(), HasSubstr("differs from that of the link's first stripe"));
  // A later stripe of a rejected link gets the rejection.
  {
    absl::MutexLock lock(&mu_);
    reject_ = absl::AbortedError("stale generation");
  }
  RawClient rejected0(Address(), kGeneration, {},
                      {{internal::kStripeKey, "0/2"}, {internal::kLinkIdKey, "R"}});
  EXPECT_EQ(rejected0.Wait().error_code(), grpc::StatusCode::ABORTED);
  RawClient rejected1(Address(), kGeneration, {},
                      {{internal::kStripeKey, "1/2"}, {internal::kLinkIdKey, "R"}});
  EXPECT_EQ(rejected1.Wait().error_code(), grpc::StatusCode::ABORTED);
  // Ended and waited for: a reactor must outlive its call.
  first.Cancel();
  EXPECT_EQ(first.Wait().error_code(), grpc::StatusCode::CANCELLED);
}

TEST(AutoLinkConnectionsTest, OneUnlessCoresAreSpare) {
  EXPECT_EQ(AutoLinkConnections(2, 1), 1);  // this 2-core machine, one compute thread.
  EXPECT_EQ(AutoLinkConnections(4, 4), 1);
  EXPECT_EQ(AutoLinkConnections(4, 3), 1);
  EXPECT_EQ(AutoLinkConnections(4, 2), 2);
  EXPECT_EQ(AutoLinkConnections(16, 4), 4);
  EXPECT_EQ(AutoLinkConnections(64, 1), 4);
}

TEST(PeerLinkConnectTest, ChannelCountIsChecked) {
  LinkSettings settings{Validation(), {}};
  settings.callbacks.on_tensor = [](const TensorKey&, math::Matrix) { return absl::OkStatus(); };
  EXPECT_EQ(PeerLink::Connect(std::vector<std::shared_ptr<grpc::Channel>>{}, "x",
                              Hello("stage/0", kGeneration), {}, settings)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PeerLink::Connect(CreateExchangeChannels("127.0.0.1:1", kMaxLinkConnections + 1), "x",
                              Hello("stage/0", kGeneration), {}, settings)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain::link::testing
