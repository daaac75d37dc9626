# Needs both daemons and the client SDK.
if(TARGET coordinator AND TARGET stage_worker AND TARGET pipetrain_client)
  # The stage worker registering a given speed (runtime_bench --real's real-compute workers).
  add_executable(runtime_bench_worker ${CMAKE_CURRENT_LIST_DIR}/runtime_bench_worker.cc)
  target_link_libraries(runtime_bench_worker PRIVATE pipetrain_worker_daemon pipetrain_heap_tuning
    pipetrain_cpu_set pipetrain_lock_checks absl::strings pipetrain_warnings)
  add_executable(runtime_bench ${CMAKE_CURRENT_LIST_DIR}/runtime_bench.cc)
  target_link_libraries(runtime_bench PRIVATE pipetrain_client pipetrain_model pipetrain_schedule
    pipetrain_io pipetrain_cpu_set pipetrain_warnings)
  target_compile_definitions(runtime_bench PRIVATE
    PIPETRAIN_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
    PIPETRAIN_COORDINATOR_BINARY="$<TARGET_FILE:coordinator>"
    PIPETRAIN_STAGE_WORKER="$<TARGET_FILE:stage_worker>"
    PIPETRAIN_BENCH_WORKER="$<TARGET_FILE:runtime_bench_worker>")
  add_dependencies(runtime_bench coordinator stage_worker runtime_bench_worker)
endif()
