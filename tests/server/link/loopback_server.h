// A test's Exchange server on 127.0.0.1 (an ephemeral port, plain text) whose streams go to an
// AcceptFn, as a stage worker's do: for tests of the link probe (link_probe_test,
// tests/server/worker/link_prober_test). Shut down when destroyed.
#ifndef PIPETRAIN_TESTS_SERVER_LINK_LOOPBACK_SERVER_H_
#define PIPETRAIN_TESTS_SERVER_LINK_LOOPBACK_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/link/exchange_service.h"

namespace pipetrain::link::testing {

class LoopbackServer {
 public:
  explicit LoopbackServer(AcceptFn accept) {
    auto service = ExchangeService::Create(LinkOptions{}, std::move(accept));
    EXPECT_TRUE(service.ok()) << service.status();
    service_ = *std::move(service);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    service_->RegisterOn(&builder);
    server_ = builder.BuildAndStart();
    EXPECT_NE(server_, nullptr);
  }
  ~LoopbackServer() { server_->Shutdown(std::chrono::system_clock::now()); }
  LoopbackServer(const LoopbackServer&) = delete;
  LoopbackServer& operator=(const LoopbackServer&) = delete;

  // "127.0.0.1:PORT".
  std::string Address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  std::unique_ptr<ExchangeService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace pipetrain::link::testing

#endif  // PIPETRAIN_TESTS_SERVER_LINK_LOOPBACK_SERVER_H_
