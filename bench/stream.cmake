# stream_bench: data-plane throughput between two processes on loopback, gRPC Exchange (frame
# codec + PeerLink) beside raw TCP. Needs pipetrain_link (server/link/).
add_executable(stream_bench ${CMAKE_CURRENT_LIST_DIR}/stream_bench.cc)
target_link_libraries(stream_bench PRIVATE pipetrain_link absl::flags absl::flags_parse
  absl::synchronization absl::time pipetrain_warnings)
