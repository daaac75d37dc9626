#include "server/introspection/reflection_v1_service.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pipetrain::introspection {
namespace {

using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;

// Adds `file` and, depth first, those of its dependencies not in `*sent` to `response`.
void AddFile(const FileDescriptor* file, std::set<std::string>* sent,
             ServerReflectionResponse* response) {
  if (!sent->insert(file->name()).second) return;
  google::protobuf::FileDescriptorProto proto;
  file->CopyTo(&proto);
  response->mutable_file_descriptor_response()->add_file_descriptor_proto(
      proto.SerializeAsString());
  for (int i = 0; i < file->dependency_count(); ++i) AddFile(file->dependency(i), sent, response);
}

void SetError(grpc::StatusCode code, const std::string& message,
              ServerReflectionResponse* response) {
  response->mutable_error_response()->set_error_code(static_cast<int32_t>(code));
  response->mutable_error_response()->set_error_message(message);
}

// Answers file_by_filename: the file and its dependencies not sent yet, or NOT_FOUND.
void AnswerFileByName(const DescriptorPool& pool, const std::string& name,
                      std::set<std::string>* sent, ServerReflectionResponse* response) {
  if (const FileDescriptor* f = pool.FindFileByName(name)) {
    AddFile(f, sent, response);
  } else {
    SetError(grpc::StatusCode::NOT_FOUND, absl::StrCat("file not found: ", name), response);
  }
}

// Answers file_containing_symbol: the symbol's file and its dependencies not sent yet, or
// NOT_FOUND.
void AnswerFileContainingSymbol(const DescriptorPool& pool, const std::string& symbol,
                                std::set<std::string>* sent, ServerReflectionResponse* response) {
  if (const FileDescriptor* f = pool.FindFileContainingSymbol(symbol)) {
    AddFile(f, sent, response);
  } else {
    SetError(grpc::StatusCode::NOT_FOUND, absl::StrCat("symbol not found: ", symbol), response);
  }
}

// Answers file_containing_extension: the extension's file and its dependencies not sent yet, or
// NOT_FOUND.
void AnswerFileContainingExtension(const DescriptorPool& pool,
                                   const grpc::reflection::v1::ExtensionRequest& ext,
                                   std::set<std::string>* sent,
                                   ServerReflectionResponse* response) {
  const google::protobuf::Descriptor* type = pool.FindMessageTypeByName(ext.containing_type());
  const google::protobuf::FieldDescriptor* field =
      type == nullptr ? nullptr : pool.FindExtensionByNumber(type, ext.extension_number());
  if (field != nullptr) {
    AddFile(field->file(), sent, response);
  } else {
    SetError(grpc::StatusCode::NOT_FOUND,
             absl::StrCat("extension ", ext.extension_number(), " of ", ext.containing_type(),
                          " not found"),
             response);
  }
}

// Answers all_extension_numbers_of_type: the numbers of the type's extensions, or NOT_FOUND.
void AnswerAllExtensionNumbers(const DescriptorPool& pool, const std::string& name,
                               ServerReflectionResponse* response) {
  const google::protobuf::Descriptor* type = pool.FindMessageTypeByName(name);
  if (type == nullptr) {
    SetError(grpc::StatusCode::NOT_FOUND, absl::StrCat("type not found: ", name), response);
    return;
  }
  std::vector<const google::protobuf::FieldDescriptor*> extensions;
  pool.FindAllExtensions(type, &extensions);
  auto* numbers = response->mutable_all_extension_numbers_response();
  numbers->set_base_type_name(type->full_name());
  for (const auto* e : extensions) numbers->add_extension_number(e->number());
}

}  // namespace

void ReflectionV1Service::SetServices(std::vector<std::string> services) {
  absl::MutexLock lock(&mu_);
  services_ = std::move(services);
}

grpc::Status ReflectionV1Service::ServerReflectionInfo(
    grpc::ServerContext* /*context*/,
    grpc::ServerReaderWriter<ServerReflectionResponse, ServerReflectionRequest>* stream) {
  std::set<std::string> sent;  // files already sent on this stream (once each, as v1alpha does).
  ServerReflectionRequest request;
  while (stream->Read(&request)) {
    ServerReflectionResponse response;
    response.set_valid_host(request.host());
    *response.mutable_original_request() = request;
    Answer(request, &sent, &response);
    if (!stream->Write(response)) break;
  }
  return grpc::Status::OK;
}

void ReflectionV1Service::Answer(const ServerReflectionRequest& request,
                                 std::set<std::string>* sent, ServerReflectionResponse* response) {
  const DescriptorPool& pool = *DescriptorPool::generated_pool();
  switch (request.message_request_case()) {
    case ServerReflectionRequest::kListServices:
      ListServices(response);
      break;
    case ServerReflectionRequest::kFileByFilename:
      AnswerFileByName(pool, request.file_by_filename(), sent, response);
      break;
    case ServerReflectionRequest::kFileContainingSymbol:
      AnswerFileContainingSymbol(pool, request.file_containing_symbol(), sent, response);
      break;
    case ServerReflectionRequest::kFileContainingExtension:
      AnswerFileContainingExtension(pool, request.file_containing_extension(), sent, response);
      break;
    case ServerReflectionRequest::kAllExtensionNumbersOfType:
      AnswerAllExtensionNumbers(pool, request.all_extension_numbers_of_type(), response);
      break;
    case ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
      SetError(grpc::StatusCode::UNIMPLEMENTED, "empty reflection request", response);
      break;
  }
}

void ReflectionV1Service::ListServices(ServerReflectionResponse* response) {
  absl::MutexLock lock(&mu_);
  for (const std::string& name : services_) {
    response->mutable_list_services_response()->add_service()->set_name(name);
  }
}

}  // namespace pipetrain::introspection
