# `pipetrain train` and `pipetrain local` command libraries, on the client SDK.
# Included from client/CMakeLists.txt; safe to include more than once.
include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/../sdk/sdk.cmake)
# TrainingOptions, shared by reference/train/local. Belongs in client/CMakeLists.txt's
# pipetrain_cli_commands sources; added here while that file is owned elsewhere.
target_sources(pipetrain_cli_commands PRIVATE ${CMAKE_CURRENT_LIST_DIR}/training_options.cc)
add_library(pipetrain_cli_train
  ${CMAKE_CURRENT_LIST_DIR}/interrupt.cc
  ${CMAKE_CURRENT_LIST_DIR}/job_commands.cc
  ${CMAKE_CURRENT_LIST_DIR}/local_command.cc
  ${CMAKE_CURRENT_LIST_DIR}/step_trace.cc
  ${CMAKE_CURRENT_LIST_DIR}/train_command.cc
)
target_link_libraries(pipetrain_cli_train
  PUBLIC pipetrain_cli_commands pipetrain_client pipetrain_model pipetrain_schedule pipetrain_io absl::status
         absl::statusor absl::strings absl::str_format absl::time
  PRIVATE pipetrain_util pipetrain_cpu_set pipetrain_warnings nlohmann_json::nlohmann_json)
# Build-time locations of the daemons `pipetrain local` starts (used when they are not found next
# to the pipetrain binary).
set(_pt_coordinator_bin "${CMAKE_BINARY_DIR}/server/coordinator/coordinator")
set(_pt_worker_bin "${CMAKE_BINARY_DIR}/server/worker/stage_worker")
target_compile_definitions(pipetrain_cli_train PRIVATE
  PIPETRAIN_COORDINATOR_BINARY="${_pt_coordinator_bin}"
  PIPETRAIN_WORKER_BINARY="${_pt_worker_bin}")
# `pipetrain local` runs the daemons: build them with the CLI when they are part of the build.
foreach(_pt_daemon coordinator stage_worker)
  if(TARGET ${_pt_daemon})
    add_dependencies(pipetrain_cli_train ${_pt_daemon})
  endif()
endforeach()
