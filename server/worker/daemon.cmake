# pipetrain_worker_daemon: the stage worker daemon as a library (StageWorkerDaemon: control
# stream to the coordinator, job set-up, compute thread, data-plane links), and the thin
# `stage_worker` executable. Included from server/worker/CMakeLists.txt
# (`include(${CMAKE_CURRENT_LIST_DIR}/daemon.cmake)`); brings in link.cmake if nobody did.
if(NOT TARGET pipetrain_worker_link)
  include(${CMAKE_CURRENT_LIST_DIR}/link.cmake)
endif()
add_library(pipetrain_worker_daemon
  ${CMAKE_CURRENT_LIST_DIR}/proto_convert.cc
  ${CMAKE_CURRENT_LIST_DIR}/worker.cc
)
target_include_directories(pipetrain_worker_daemon PUBLIC ${CMAKE_SOURCE_DIR})
target_link_libraries(pipetrain_worker_daemon
  PUBLIC pipetrain_worker_core pipetrain_worker_link pipetrain_model pipetrain_schedule
    pipetrain_proto pipetrain_wire pipetrain_util gRPC::grpc++ absl::status absl::statusor
    absl::strings absl::str_format absl::synchronization absl::time
  PRIVATE pipetrain_warnings pipetrain_eigen)
# Server reflection (grpc_cli / grpcurl) when the package ships it; the daemon works without.
if(TARGET gRPC::grpc++_reflection)
  target_link_libraries(pipetrain_worker_daemon PRIVATE gRPC::grpc++_reflection)
  target_compile_definitions(pipetrain_worker_daemon PRIVATE PIPETRAIN_HAVE_GRPC_REFLECTION=1)
else()
  message(STATUS "gRPC::grpc++_reflection not found: stage_worker serves no reflection")
endif()

add_executable(stage_worker ${CMAKE_CURRENT_LIST_DIR}/main.cc)
target_link_libraries(stage_worker
  PRIVATE pipetrain_worker_daemon absl::flags absl::flags_parse absl::flags_usage
    absl::str_format pipetrain_warnings)
