add_executable(math_bench ${CMAKE_CURRENT_LIST_DIR}/math_bench.cc)
target_link_libraries(math_bench PRIVATE pipetrain_model pipetrain_math_layers pipetrain_heap_tuning
  ${BLAS_LIBRARIES} pipetrain_warnings)
target_compile_definitions(math_bench PRIVATE PIPETRAIN_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
# The attention rows run gqa_attention from pipetrain_math_layers, built at PIPETRAIN_ARCH.
target_compile_definitions(math_bench PRIVATE PIPETRAIN_ARCH_NAME="${PIPETRAIN_ARCH}")
