# Needs both daemons and the client SDK.
if(TARGET coordinator AND TARGET stage_worker AND TARGET pipetrain_client)
  add_executable(runtime_bench ${CMAKE_CURRENT_LIST_DIR}/runtime_bench.cc)
  target_link_libraries(runtime_bench PRIVATE pipetrain_client pipetrain_model pipetrain_schedule
    pipetrain_io pipetrain_warnings)
  target_compile_definitions(runtime_bench PRIVATE
    PIPETRAIN_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
    PIPETRAIN_COORDINATOR="$<TARGET_FILE:coordinator>"
    PIPETRAIN_STAGE_WORKER="$<TARGET_FILE:stage_worker>")
  add_dependencies(runtime_bench coordinator stage_worker)
endif()
