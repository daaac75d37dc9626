# `pipetrain schedule` and `pipetrain partition` command libraries (options, parsing, running).
# Included from client/CMakeLists.txt; safe to include more than once.
include_guard(GLOBAL)
add_library(pipetrain_cli_schedule
  ${CMAKE_CURRENT_LIST_DIR}/partition_command.cc
  ${CMAKE_CURRENT_LIST_DIR}/schedule_command.cc
)
target_link_libraries(pipetrain_cli_schedule
  PUBLIC pipetrain_schedule pipetrain_partition absl::status absl::statusor absl::strings
         absl::str_format
  PRIVATE pipetrain_util nlohmann_json::nlohmann_json pipetrain_warnings)
