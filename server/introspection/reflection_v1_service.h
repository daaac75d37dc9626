// ReflectionV1Service: gRPC server reflection v1 (grpc.reflection.v1.ServerReflection), which
// gRPC 1.51 lacks (its plugin serves only v1alpha). Answers from the process's generated
// descriptor pool, like gRPC's own v1alpha service; lists the services of the server it is
// added to. Added to a server with AddReflectionV1 (introspection.h).
#ifndef PIPETRAIN_SERVER_INTROSPECTION_REFLECTION_V1_SERVICE_H_
#define PIPETRAIN_SERVER_INTROSPECTION_REFLECTION_V1_SERVICE_H_

#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpc/reflection/v1/reflection.grpc.pb.h"

namespace pipetrain::introspection {

class ReflectionV1Service final : public grpc::reflection::v1::ServerReflection::Service {
 public:
  ReflectionV1Service() = default;
  ReflectionV1Service(const ReflectionV1Service&) = delete;
  ReflectionV1Service& operator=(const ReflectionV1Service&) = delete;

  // The fully-qualified names ListServices answers with (the server's registered services).
  // Thread-safe.
  void SetServices(std::vector<std::string> services);

  // One response per request, in order, until the client half-closes. A request the pool cannot
  // answer gets an error_response (NOT_FOUND naming what was asked; UNIMPLEMENTED for an empty
  // request); the stream itself always ends OK.
  grpc::Status ServerReflectionInfo(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<grpc::reflection::v1::ServerReflectionResponse,
                               grpc::reflection::v1::ServerReflectionRequest>* stream) override;

 private:
  // Fills `response` with the answer to `request` (or its error_response); `sent`: the files
  // already sent on this stream, which are not sent again.
  void Answer(const grpc::reflection::v1::ServerReflectionRequest& request,
              std::set<std::string>* sent, grpc::reflection::v1::ServerReflectionResponse* response)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Answers list_services with the services SetServices named.
  void ListServices(grpc::reflection::v1::ServerReflectionResponse* response)
      ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  // What ListServices answers; set once the server is built.
  std::vector<std::string> services_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain::introspection

#endif  // PIPETRAIN_SERVER_INTROSPECTION_REFLECTION_V1_SERVICE_H_
