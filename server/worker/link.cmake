# pipetrain_worker_link: the data plane's gRPC links — PeerLink (one StageWorker.Exchange stream
# with credit-based flow control) and ExchangeService (the server side). Included from
# server/worker/CMakeLists.txt (`include(${CMAKE_CURRENT_LIST_DIR}/link.cmake)`).
add_library(pipetrain_worker_link
  ${CMAKE_CURRENT_LIST_DIR}/exchange_service.cc
  ${CMAKE_CURRENT_LIST_DIR}/peer_link.cc
)
target_include_directories(pipetrain_worker_link PUBLIC ${CMAKE_SOURCE_DIR})
target_link_libraries(pipetrain_worker_link
  PUBLIC pipetrain_wire pipetrain_util gRPC::grpc++ absl::status absl::statusor absl::strings
    absl::synchronization absl::time
  PRIVATE pipetrain_warnings)
