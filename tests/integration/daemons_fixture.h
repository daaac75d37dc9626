// The GoogleTest fixture of the integration tests that run a coordinator and workers (daemons.h)
// in a directory of their own: the test's SetUp makes dir_ and starts daemons_; the tear-down stops
// them (a daemon that crashes on the way out fails the test) and removes dir_ after a test that
// passed, keeping the logs of one that failed. The including test defines the binaries' paths as
// daemons.h asks.
#ifndef PIPETRAIN_TESTS_INTEGRATION_DAEMONS_FIXTURE_H_
#define PIPETRAIN_TESTS_INTEGRATION_DAEMONS_FIXTURE_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/daemons.h"
#include "tests/integration/run_command.h"

namespace pipetrain::testing {

class DaemonsTest : public ::testing::Test {
 protected:
  // Stops daemons_ (expecting each to end cleanly) and removes dir_ unless the test failed.
  // Derived fixtures that stop processes of their own do so first, then call this.
  void TearDown() override {
    EXPECT_EQ(daemons_.Stop(), "");
    if (!HasFailure()) RunCommand(absl::StrCat("rm -rf ", dir_));
  }

  std::string dir_;  // the test's directory (TempDir): the daemons' logs and the test's files.
  Daemons daemons_;
};

}  // namespace pipetrain::testing

#endif  // PIPETRAIN_TESTS_INTEGRATION_DAEMONS_FIXTURE_H_
