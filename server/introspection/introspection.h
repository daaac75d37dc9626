// Health and reflection on a daemon's gRPC server (both daemons call these):
//  - health: gRPC's DefaultHealthCheckService answering the empty name and each of the server's
//    own services by name ("pipetrain.v1.Coordinator", "pipetrain.v1.StageWorker");
//  - reflection: v1alpha (gRPC's plugin, when libgrpc++_reflection is built in) and v1
//    (ReflectionV1Service), both listing every service the server registers.
#ifndef PIPETRAIN_SERVER_INTROSPECTION_INTROSPECTION_H_
#define PIPETRAIN_SERVER_INTROSPECTION_INTROSPECTION_H_

#include <string>
#include <vector>

namespace grpc {
class Server;
class ServerBuilder;
}  // namespace grpc

namespace pipetrain::introspection {

// Before builder->BuildAndStart(): enables the default health service and reflection v1alpha
// for the servers this process builds (gRPC's switches are process-wide) and adds reflection v1
// to `builder`. Not thread-safe with respect to `builder`.
void AddHealthAndReflection(grpc::ServerBuilder* builder);

// After BuildAndStart(): the server as a whole ("") and every name in `services` SERVING. No-op
// without a health service. Thread-safe.
void SetServing(grpc::Server* server, const std::vector<std::string>& services);

// Before Shutdown(): every name NOT_SERVING, so probes see the daemon going away. Thread-safe.
void SetNotServing(grpc::Server* server);

}  // namespace pipetrain::introspection

#endif  // PIPETRAIN_SERVER_INTROSPECTION_INTROSPECTION_H_
