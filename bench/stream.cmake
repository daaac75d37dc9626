# stream_bench: data-plane throughput between two processes on loopback, gRPC Exchange (frame
# codec + PeerLink), plaintext and over mTLS, beside raw TCP. Needs pipetrain_link (server/link/).
add_executable(stream_bench ${CMAKE_CURRENT_LIST_DIR}/stream_bench.cc)
target_link_libraries(stream_bench PRIVATE pipetrain_link pipetrain_net pipetrain_heap_tuning absl::flags
  absl::flags_parse absl::synchronization absl::time pipetrain_warnings)
# The TLS case makes its test CA with scripts/make_test_certs.sh.
target_compile_definitions(stream_bench PRIVATE PIPETRAIN_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
