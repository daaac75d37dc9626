# pipetrain_client: the client SDK (Connect, CreateJob, TrainStep / TrainSession, GetJob,
# ListWorkers, Checkpoint). Included from client/cli/train_commands.cmake; safe to include twice.
include_guard(GLOBAL)
add_library(pipetrain_client ${CMAKE_CURRENT_LIST_DIR}/client.cc)
target_link_libraries(pipetrain_client
  PUBLIC pipetrain_proto pipetrain_wire pipetrain_net pipetrain_eigen gRPC::grpc++ absl::status
         absl::statusor
         absl::strings absl::time
  PRIVATE pipetrain_warnings)
