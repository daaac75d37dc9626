// A test's Exchange server on 127.0.0.1 (an ephemeral port, plain text) whose streams go to an
// AcceptFn, as a stage worker's do: for the link tests (link_test_fixture.h, link_probe_test),
// tests/server/worker/link_prober_test and gradient_exchange_link_test. Shut down when destroyed.
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
  // Serves on an ephemeral port; a failure to create the service or to start is a test failure,
  // and leaves serving() false.
  explicit LoopbackServer(AcceptFn accept, LinkOptions options = {}) {
    auto service = ExchangeService::Create(options, std::move(accept));
    EXPECT_TRUE(service.ok()) << service.status();
    if (!service.ok()) return;
    service_ = *std::move(service);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    service_->RegisterOn(&builder);
    server_ = builder.BuildAndStart();
    EXPECT_NE(server_, nullptr);
  }
  ~LoopbackServer() { Shutdown(); }
  LoopbackServer(const LoopbackServer&) = delete;
  LoopbackServer& operator=(const LoopbackServer&) = delete;

  bool serving() const { return server_ != nullptr; }
  int port() const { return port_; }
  // "127.0.0.1:PORT".
  std::string Address() const { return absl::StrCat("127.0.0.1:", port_); }
  // Closes the port and ends every stream now (idempotent).
  void Shutdown() {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

 private:
  std::unique_ptr<ExchangeService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace pipetrain::link::testing

#endif  // PIPETRAIN_TESTS_SERVER_LINK_LOOPBACK_SERVER_H_
