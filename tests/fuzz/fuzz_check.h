// PT_FUZZ_CHECK(cond): an invariant of a fuzz target. A violation prints the condition and
// aborts, which libFuzzer (and the corpus replay test) reports as a crash.
#ifndef PIPETRAIN_TESTS_FUZZ_FUZZ_CHECK_H_
#define PIPETRAIN_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define PT_FUZZ_CHECK(cond)                                                                    \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "%s:%d: fuzz invariant violated: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                            \
    }                                                                                          \
  } while (false)

#endif  // PIPETRAIN_TESTS_FUZZ_FUZZ_CHECK_H_
