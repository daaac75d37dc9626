# replica_bench: the reduction over data-parallel replicas (server/worker/replica_reducer.h) on
# loopback PeerLinks, per replica count, against one replica's step and raw TCP in the same run.
add_executable(replica_bench ${CMAKE_CURRENT_LIST_DIR}/replica_bench.cc)
target_link_libraries(replica_bench PRIVATE pipetrain_worker_core pipetrain_link pipetrain_model
  absl::flags absl::flags_parse absl::strings absl::synchronization absl::time gRPC::grpc++ pipetrain_warnings
  pipetrain_eigen)
target_compile_definitions(replica_bench PRIVATE PIPETRAIN_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
