// Runs a fuzz target's LLVMFuzzerTestOneInput (linked into this test) over its seed corpus
// (PIPETRAIN_FUZZ_CORPUS) and over a bounded set of deterministic mutations of it, in ordinary
// builds without libFuzzer: a crash or a violated invariant (PT_FUZZ_CHECK aborts) fails the test.
// The corpus holds the regression inputs of every bug the fuzzers found. PIPETRAIN_FUZZ_SUITE names
// the test suite (e.g. FrameDecoderCorpusTest).
#include <dirent.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/integration/run_command.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// Every regular file of the corpus directory, sorted by name.
std::vector<std::string> CorpusFiles() {
  std::vector<std::string> files;
  DIR* dir = opendir(PIPETRAIN_FUZZ_CORPUS);
  if (dir == nullptr) return files;
  while (const dirent* e = readdir(dir)) {
    if (e->d_type == DT_REG) files.push_back(std::string(PIPETRAIN_FUZZ_CORPUS) + "/" + e->d_name);
  }
  closedir(dir);
  std::sort(files.begin(), files.end());
  return files;
}

int RunInput(const std::string& input) {
  return LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

TEST(PIPETRAIN_FUZZ_SUITE, EveryCorpusInputRunsCleanly) {
  const std::vector<std::string> files = CorpusFiles();
  ASSERT_GE(files.size(), 2u) << "no seed corpus in " << PIPETRAIN_FUZZ_CORPUS;
  for (const std::string& path : files) {
    SCOPED_TRACE(path);
    EXPECT_EQ(RunInput(pipetrain::testing::ReadFile(path)), 0);
  }
}

// Byte flips, insertions, deletions, truncations and splices of the seeds, with a fixed seed:
// the same inputs on every run. Bounded by count (1000 per seed) and by time (5 s in all).
TEST(PIPETRAIN_FUZZ_SUITE, BoundedMutationsRunCleanly) {
  const std::vector<std::string> files = CorpusFiles();
  ASSERT_FALSE(files.empty());
  std::vector<std::string> seeds;
  for (const std::string& path : files) seeds.push_back(pipetrain::testing::ReadFile(path));
  std::mt19937_64 gen(20261123);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  int runs = 0;
  for (size_t s = 0; s < seeds.size(); ++s) {
    for (int i = 0; i < 1000 && absl::Now() < deadline; ++i) {
      std::string input = seeds[s];
      const int edits = 1 + static_cast<int>(gen() % 4);
      for (int e = 0; e < edits; ++e) {
        const size_t pos = input.empty() ? 0 : gen() % input.size();
        switch (gen() % 6) {
          case 0:  // flip a bit
            if (!input.empty()) input[pos] = static_cast<char>(input[pos] ^ (1u << (gen() % 8)));
            break;
          case 1:  // an interesting byte
            if (!input.empty()) {
              static const char kBytes[] = {0, 1, '\x7f', '\x80', '\xff', ',', '\n', '"', '9'};
              input[pos] = kBytes[gen() % sizeof(kBytes)];
            }
            break;
          case 2:  // insert bytes
            input.insert(pos, std::string(1 + gen() % 8, static_cast<char>(gen())));
            break;
          case 3:  // delete bytes
            input.erase(pos, 1 + gen() % 8);
            break;
          case 4:  // truncate
            input.resize(pos);
            break;
          case 5: {  // splice in a piece of another seed
            const std::string& other = seeds[gen() % seeds.size()];
            if (!other.empty()) {
              const size_t from = gen() % other.size();
              input.insert(pos, other.substr(from, 1 + gen() % 64));
            }
            break;
          }
        }
      }
      SCOPED_TRACE(::testing::Message() << files[s] << " mutation " << i);
      ASSERT_EQ(RunInput(input), 0);
      ++runs;
    }
  }
  EXPECT_GT(runs, 0);
}

}  // namespace
