// A throw-away PKI for tests of mTLS: runs scripts/make_test_certs.sh (the openssl command) into a
// fresh temporary directory. Header-only; used by unit and integration tests.
#ifndef PIPETRAIN_TESTS_COMMON_NET_TEST_CERTS_H_
#define PIPETRAIN_TESTS_COMMON_NET_TEST_CERTS_H_

#include <stdlib.h>

#include <cstdlib>
#include <string>

namespace pipetrain::testing {

// The source tree: $PIPETRAIN_SOURCE_DIR (set by CTest), else the build-time definition.
inline std::string SourceDir() {
  if (const char* env = std::getenv("PIPETRAIN_SOURCE_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
#ifdef PIPETRAIN_SOURCE_DIR
  return PIPETRAIN_SOURCE_DIR;
#else
  return ".";
#endif
}

// Writes the test CA and certificates (see scripts/make_test_certs.sh: ca.pem, coordinator.*,
// worker-N.*, client.*, worker-wronghost.*, other-ca.*, other-worker.*, tokens) into a new
// directory under $TEST_TMPDIR or /tmp and returns its path; "" if that failed. About 1 s.
inline std::string MakeTestCerts() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base != nullptr ? base : "/tmp") + "/pipetrain_certs_XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) return "";
  const std::string command =
      "WORKERS=2 bash '" + SourceDir() + "/scripts/make_test_certs.sh' '" + dir + "' 2>/dev/null";
  return std::system(command.c_str()) == 0 ? dir : "";
}

}  // namespace pipetrain::testing

#endif  // PIPETRAIN_TESTS_COMMON_NET_TEST_CERTS_H_
