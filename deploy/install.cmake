# `cmake --install` rules and the Debian package (CPack). Included from the top-level
# CMakeLists.txt after every target is defined. Layout under the prefix (docs/deploy.md):
#   bin/                      pipetrain, coordinator, stage_worker
#   lib/pipetrain/            libpipetrain_sentencepiece.so, the tokenizers' SentencePiece module
#                             (found from bin/ at run time: common/io/sentencepiece_model.h)
#   share/pipetrain/data/     the bundled data sets (found from bin/ at run time: common/io/data_dir.h)
#   share/pipetrain/examples/ model specs
#   include/pipetrain/        the client SDK's headers (client/sdk/client.h, job_watch.h and what
#                             they include)
#   lib/                      the SDK's static libraries, lib/cmake/pipetrain/ its CMake package
include_guard(GLOBAL)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS pipetrain coordinator stage_worker RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  COMPONENT runtime)
install(TARGETS pipetrain_sentencepiece_module LIBRARY DESTINATION lib/pipetrain COMPONENT runtime)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/data/ DESTINATION ${CMAKE_INSTALL_DATADIR}/pipetrain/data
  COMPONENT runtime)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/examples/
  DESTINATION ${CMAKE_INSTALL_DATADIR}/pipetrain/examples COMPONENT runtime)

# The SDK: `find_package(pipetrain CONFIG)` then link `pipetrain::client`.
set(_pt_sdk_include ${CMAKE_INSTALL_INCLUDEDIR}/pipetrain)
target_include_directories(pipetrain_client INTERFACE $<INSTALL_INTERFACE:${_pt_sdk_include}>)
install(TARGETS pipetrain_client pipetrain_proto pipetrain_wire pipetrain_eigen pipetrain_util
  pipetrain_warnings pipetrain_net pipetrain_secret pipetrain_io
  EXPORT pipetrain-targets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT sdk)
install(FILES ${CMAKE_SOURCE_DIR}/client/sdk/client.h ${CMAKE_SOURCE_DIR}/client/sdk/job_watch.h
  DESTINATION ${_pt_sdk_include}/client/sdk COMPONENT sdk)
install(FILES ${CMAKE_SOURCE_DIR}/common/math/tensor.h DESTINATION ${_pt_sdk_include}/common/math
  COMPONENT sdk)
install(FILES ${CMAKE_SOURCE_DIR}/common/net/transport_security.h
  DESTINATION ${_pt_sdk_include}/common/net COMPONENT sdk)
install(DIRECTORY ${CMAKE_BINARY_DIR}/proto/pipetrain/ DESTINATION ${_pt_sdk_include}/pipetrain
  COMPONENT sdk FILES_MATCHING PATTERN "*.pb.h")
install(EXPORT pipetrain-targets NAMESPACE pipetrain::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/pipetrain COMPONENT sdk)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/pipetrain-config.cmake.in
  ${CMAKE_BINARY_DIR}/pipetrain-config.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/pipetrain)
install(FILES ${CMAKE_BINARY_DIR}/pipetrain-config.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/pipetrain COMPONENT sdk)
# The SDK's public name: pipetrain::client.
set_target_properties(pipetrain_client PROPERTIES EXPORT_NAME client)

# systemd units for bare metal and their options template (deploy/systemd/, docs/deploy.md).
install(FILES ${CMAKE_CURRENT_LIST_DIR}/systemd/pipetrain-coordinator.service
  ${CMAKE_CURRENT_LIST_DIR}/systemd/pipetrain-worker.service
  DESTINATION lib/systemd/system COMPONENT runtime)
install(FILES ${CMAKE_CURRENT_LIST_DIR}/systemd/pipetrain.default
  DESTINATION ${CMAKE_INSTALL_DATADIR}/pipetrain/systemd COMPONENT runtime)
install(FILES ${CMAKE_SOURCE_DIR}/docs/deploy.md DESTINATION ${CMAKE_INSTALL_DOCDIR}
  COMPONENT runtime)

# `cpack -G DEB` in the build directory: pipetrain_VERSION_amd64.deb with everything above, the
# shared-library dependencies found by dpkg-shlibdeps, and a postinst that adds the pipetrain
# system user.
set(CPACK_PACKAGE_NAME pipetrain)
set(CPACK_PACKAGE_VENDOR "pipetrain")
set(CPACK_PACKAGE_CONTACT "pipetrain maintainers <pipetrain@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "Pipeline-parallel training service: coordinator, stage_worker, pipetrain CLI and SDK")
set(CPACK_GENERATOR DEB)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${CMAKE_CURRENT_LIST_DIR}/debian/postinst)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
include(CPack)
