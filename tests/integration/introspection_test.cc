// Health per service name and server reflection (v1 and v1alpha) on a real `coordinator` and
// `stage_worker`, asked the way probes and grpcurl ask: over gRPC on 127.0.0.1.
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_callback.h>
#include <grpcpp/impl/codegen/sync_stream.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/descriptor.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/integration/daemons.h"

namespace pipetrain {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;
using ::testing::IsSupersetOf;

// Health Check of `service` at `channel`: the status code, and the serving status if OK.
grpc::StatusCode Check(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                       HealthCheckResponse::ServingStatus* status) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  const grpc::Status s = stub->Check(&context, request, &response);
  *status = response.status();
  return s.error_code();
}

// One reflection request on a fresh ServerReflectionInfo stream of `method` (v1 or v1alpha: the
// messages are the same on the wire, only the method name differs).
ServerReflectionResponse Reflect(const std::shared_ptr<grpc::Channel>& channel,
                                 const std::string& method,
                                 const ServerReflectionRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  const grpc::internal::RpcMethod rpc(method.c_str(), grpc::internal::RpcMethod::BIDI_STREAMING,
                                      channel);
  std::unique_ptr<grpc::ClientReaderWriter<ServerReflectionRequest, ServerReflectionResponse>>
      stream(grpc::internal::ClientReaderWriterFactory<
             ServerReflectionRequest, ServerReflectionResponse>::Create(channel.get(), rpc,
                                                                        &context));
  ServerReflectionResponse response;
  EXPECT_TRUE(stream->Write(request));
  stream->WritesDone();
  EXPECT_TRUE(stream->Read(&response));
  ServerReflectionResponse extra;
  EXPECT_FALSE(stream->Read(&extra));  // one response per request
  EXPECT_TRUE(stream->Finish().ok());
  return response;
}

constexpr char kV1[] = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
constexpr char kV1Alpha[] = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";

std::vector<std::string> ListServices(const std::shared_ptr<grpc::Channel>& channel,
                                      const std::string& method) {
  ServerReflectionRequest request;
  request.set_list_services("");
  const ServerReflectionResponse r = Reflect(channel, method, request);
  std::vector<std::string> names;
  for (const auto& s : r.list_services_response().service()) names.push_back(s.name());
  return names;
}

class IntrospectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("introspection_");
    ASSERT_EQ(daemons_.Start(dir_, 1), "");
    auto workers = daemons_.client().ListWorkers();
    ASSERT_TRUE(workers.ok()) << workers.status();
    ASSERT_EQ(workers->size(), 1u);
    coordinator_ = grpc::CreateChannel(daemons_.address(), grpc::InsecureChannelCredentials());
    worker_ = grpc::CreateChannel((*workers)[0].address(), grpc::InsecureChannelCredentials());
  }

  std::string dir_;
  testing::Daemons daemons_;
  std::shared_ptr<grpc::Channel> coordinator_, worker_;
};

TEST_F(IntrospectionTest, HealthAnswersEveryServiceByName) {
  HealthCheckResponse::ServingStatus status = HealthCheckResponse::UNKNOWN;
  for (const std::string name : {"", "pipetrain.v1.Coordinator"}) {
    EXPECT_EQ(Check(coordinator_, name, &status), grpc::StatusCode::OK) << name;
    EXPECT_EQ(status, HealthCheckResponse::SERVING) << name;
  }
  for (const std::string name : {"", "pipetrain.v1.StageWorker"}) {
    EXPECT_EQ(Check(worker_, name, &status), grpc::StatusCode::OK) << name;
    EXPECT_EQ(status, HealthCheckResponse::SERVING) << name;
  }
  // A name the daemon does not serve is NOT_FOUND (the other daemon's service included).
  EXPECT_EQ(Check(coordinator_, "pipetrain.v1.StageWorker", &status), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Check(worker_, "pipetrain.v1.Coordinator", &status), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Check(worker_, "nope", &status), grpc::StatusCode::NOT_FOUND);
}

TEST_F(IntrospectionTest, ReflectionV1AndV1AlphaListTheServices) {
  const std::vector<std::string> common = {"grpc.health.v1.Health",
                                           "grpc.reflection.v1.ServerReflection",
                                           "grpc.reflection.v1alpha.ServerReflection"};
  for (const char* method : {kV1, kV1Alpha}) {
    SCOPED_TRACE(method);
    std::vector<std::string> c = ListServices(coordinator_, method);
    EXPECT_THAT(c, IsSupersetOf(common));
    EXPECT_THAT(c, ::testing::Contains("pipetrain.v1.Coordinator"));
    std::vector<std::string> w = ListServices(worker_, method);
    EXPECT_THAT(w, IsSupersetOf(common));
    EXPECT_THAT(w, ::testing::Contains("pipetrain.v1.StageWorker"));
  }
}

TEST_F(IntrospectionTest, ReflectionV1DescribesTheServicesAndNamesWhatItLacks) {
  ServerReflectionRequest request;
  request.set_file_containing_symbol("pipetrain.v1.Coordinator");
  ServerReflectionResponse r = Reflect(coordinator_, kV1, request);
  ASSERT_GT(r.file_descriptor_response().file_descriptor_proto_size(), 0) << r.DebugString();
  google::protobuf::FileDescriptorProto file;
  ASSERT_TRUE(file.ParseFromString(r.file_descriptor_response().file_descriptor_proto(0)));
  EXPECT_EQ(file.name(), "pipetrain/v1/coordinator.proto");
  EXPECT_EQ(file.package(), "pipetrain.v1");
  bool found = false;
  for (const auto& s : file.service()) found = found || s.name() == "Coordinator";
  EXPECT_TRUE(found);
  // Its dependencies come along (model.proto at least), each file once.
  std::set<std::string> names;
  for (const std::string& bytes : r.file_descriptor_response().file_descriptor_proto()) {
    google::protobuf::FileDescriptorProto f;
    ASSERT_TRUE(f.ParseFromString(bytes));
    EXPECT_TRUE(names.insert(f.name()).second) << f.name();
  }
  EXPECT_EQ(names.count("pipetrain/v1/model.proto"), 1u);

  request.set_file_containing_symbol("pipetrain.v1.StageWorker.Exchange");
  r = Reflect(worker_, kV1, request);
  ASSERT_GT(r.file_descriptor_response().file_descriptor_proto_size(), 0) << r.DebugString();
  ASSERT_TRUE(file.ParseFromString(r.file_descriptor_response().file_descriptor_proto(0)));
  EXPECT_EQ(file.name(), "pipetrain/v1/worker.proto");

  request.set_file_containing_symbol("pipetrain.v1.NoSuchThing");
  r = Reflect(coordinator_, kV1, request);
  EXPECT_EQ(r.error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(r.error_response().error_message(), ::testing::HasSubstr("pipetrain.v1.NoSuchThing"));
  EXPECT_EQ(r.original_request().file_containing_symbol(), "pipetrain.v1.NoSuchThing");
}

}  // namespace
}  // namespace pipetrain
