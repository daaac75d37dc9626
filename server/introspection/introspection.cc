#include "server/introspection/introspection.h"

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/impl/server_initializer.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <memory>
#include <utility>
#ifdef PIPETRAIN_HAVE_GRPC_REFLECTION
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#endif

#include "server/introspection/reflection_v1_service.h"

namespace pipetrain::introspection {
namespace {

// Registers a ReflectionV1Service on the server being built and, once every service is
// registered, tells it their names (as gRPC's own reflection plugin does for v1alpha).
class ReflectionV1Plugin final : public grpc::ServerBuilderPlugin {
 public:
  std::string name() override { return "pipetrain_reflection_v1"; }
  void InitServer(grpc::ServerInitializer* si) override { si->RegisterService(service_); }
  void Finish(grpc::ServerInitializer* si) override {
    const std::vector<std::string>* services = si->GetServiceList();
    if (services != nullptr) service_->SetServices(*services);
  }
  void ChangeArguments(const std::string& /*name*/, void* /*value*/) override {}
  bool has_sync_methods() const override { return true; }

 private:
  const std::shared_ptr<ReflectionV1Service> service_ = std::make_shared<ReflectionV1Service>();
};

// Adds a ReflectionV1Plugin to one builder (gRPC's plugin factories would add it to all).
class ReflectionV1Option final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments* /*args*/) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->push_back(std::make_unique<ReflectionV1Plugin>());
  }
};

}  // namespace

void AddHealthAndReflection(grpc::ServerBuilder* builder) {
  grpc::EnableDefaultHealthCheckService(true);
#ifdef PIPETRAIN_HAVE_GRPC_REFLECTION
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
#endif
  builder->SetOption(std::make_unique<ReflectionV1Option>());
}

void SetServing(grpc::Server* server, const std::vector<std::string>& services) {
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus("", true);
  for (const std::string& name : services) health->SetServingStatus(name, true);
}

void SetNotServing(grpc::Server* server) {
  if (grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService()) {
    health->SetServingStatus(false);
  }
}

}  // namespace pipetrain::introspection
