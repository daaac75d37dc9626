# Recovery time after a SIGKILLed worker vs a full restart (run by hand, not in ctest). Drives the
# real binaries with the integration tests' process helpers (tests/integration/daemons.h).
if(TARGET coordinator AND TARGET stage_worker AND TARGET pipetrain_client AND TARGET pipetrain)
  add_executable(recovery_bench ${CMAKE_CURRENT_LIST_DIR}/recovery_bench.cc)
  target_link_libraries(recovery_bench PRIVATE pipetrain_client pipetrain_util pipetrain_command_line absl::flags
    absl::flags_parse absl::flags_usage absl::strings absl::time nlohmann_json::nlohmann_json
    pipetrain_warnings)
  target_compile_definitions(recovery_bench PRIVATE
    PIPETRAIN_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
    PIPETRAIN_BINARY="$<TARGET_FILE:pipetrain>"
    PIPETRAIN_COORDINATOR_BINARY="$<TARGET_FILE:coordinator>"
    PIPETRAIN_STAGE_WORKER_BINARY="$<TARGET_FILE:stage_worker>")
  add_dependencies(recovery_bench pipetrain coordinator stage_worker)
endif()
