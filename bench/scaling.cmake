# The scaling table: the planner's predicted throughput for 8 to 1,024 workers (R x S) of a model
# timed on this host (docs/scaling.md, "How a job scales"; bench/scaling_bench.sh runs it).
if(TARGET pipetrain_cli_train)
  add_executable(scaling_bench ${CMAKE_CURRENT_LIST_DIR}/scaling_bench.cc)
  target_link_libraries(scaling_bench PRIVATE pipetrain_cli_train pipetrain_plan absl::flags
    absl::flags_parse absl::strings pipetrain_warnings)
endif()
