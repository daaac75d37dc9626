#include "common/wire/tensor_reassembler.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::wire {
namespace {

using ::testing::HasSubstr;

const TensorKey kKey{3, 1, 2, TensorKind::kActivation};

math::Matrix Pattern(int64_t rows, int64_t cols, uint32_t seed) {
  math::Matrix m(rows, cols);
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < m.size(); ++i) {
    const uint32_t bits = rng();
    std::memcpy(m.data() + i, &bits, sizeof(bits));
  }
  return m;
}

// Copies bytes [offset, offset + length) of `source` through a reservation; returns the
// completed tensor if that was its last range.
std::optional<TensorReassembler::Completed> Deliver(TensorReassembler& r, const TensorKey& key,
                                                    const math::Matrix& source, int64_t offset,
                                                    int64_t length) {
  auto reserved = r.Reserve(key, source.rows(), source.cols(), offset, length);
  EXPECT_TRUE(reserved.ok()) << reserved.status();
  if (!reserved.ok()) return std::nullopt;
  std::memcpy(reserved->destination, reinterpret_cast<const char*>(source.data()) + offset, length);
  return r.Commit(*std::move(reserved));
}

// Fragments of unequal sizes in every permutation order of a shuffled run: the tensor comes out
// once, on the last commit, bit-exact.
TEST(TensorReassemblerTest, FragmentsInAnyOrderGiveTheTensorOnceBitExact) {
  const math::Matrix source = Pattern(37, 101, 1);
  const int64_t total = source.size() * 4;
  // Cut points at float and odd byte offsets alike (a stripe block ends on a float; the
  // reassembler itself does not care).
  std::vector<int64_t> cuts = {0, 4, 1000, 1001, 5000, 9000, 12345, total};
  std::mt19937 rng(5);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<size_t> order(cuts.size() - 1);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    TensorReassembler r(4);
    int completions = 0;
    for (size_t n = 0; n < order.size(); ++n) {
      const size_t i = order[n];
      auto done = Deliver(r, kKey, source, cuts[i], cuts[i + 1] - cuts[i]);
      if (n + 1 < order.size()) {
        EXPECT_FALSE(done.has_value()) << "fragment " << n << " of trial " << trial;
        EXPECT_EQ(r.open(), 1);
        continue;
      }
      ASSERT_TRUE(done.has_value());
      ++completions;
      EXPECT_EQ(done->key, kKey);
      ASSERT_EQ(done->tensor.rows(), 37);
      ASSERT_EQ(done->tensor.cols(), 101);
      EXPECT_EQ(std::memcmp(done->tensor.data(), source.data(), total), 0);
    }
    EXPECT_EQ(completions, 1);
    EXPECT_EQ(r.open(), 0);
  }
}

// Stripes copy concurrently into one tensor: 4 threads, each its own interleaved fragments.
TEST(TensorReassemblerTest, ConcurrentStripesReassembleOneTensor) {
  const math::Matrix source = Pattern(512, 1024, 2);  // 2 MiB
  const int64_t total = source.size() * 4;
  const int64_t fragment = 64 << 10;
  TensorReassembler r(4);
  std::vector<std::optional<TensorReassembler::Completed>> results(4);
  std::vector<std::thread> stripes;
  for (int s = 0; s < 4; ++s) {
    stripes.emplace_back([&, s] {
      for (int64_t offset = s * fragment; offset < total; offset += 4 * fragment) {
        auto done = Deliver(r, kKey, source, offset, std::min(fragment, total - offset));
        if (done.has_value()) results[s] = std::move(done);
      }
    });
  }
  for (std::thread& t : stripes) t.join();
  int completions = 0;
  for (auto& result : results) {
    if (!result.has_value()) continue;
    ++completions;
    EXPECT_EQ(std::memcmp(result->tensor.data(), source.data(), total), 0);
  }
  EXPECT_EQ(completions, 1);
}

TEST(TensorReassemblerTest, OverlapsAreInvalidArgument) {
  const math::Matrix source = Pattern(4, 100, 3);  // 1600 bytes
  TensorReassembler r(4);
  ASSERT_FALSE(Deliver(r, kKey, source, 400, 400).has_value());
  for (auto [offset, length] : std::vector<std::pair<int64_t, int64_t>>{
           {400, 400}, {0, 401}, {799, 10}, {500, 1}, {0, 1600}}) {
    auto reserved = r.Reserve(kKey, 4, 100, offset, length);
    ASSERT_FALSE(reserved.ok()) << offset << "+" << length;
    EXPECT_EQ(reserved.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(reserved.status().message(), HasSubstr("overlaps"));
  }
  // Adjacent ranges are fine, and complete the tensor exactly once.
  ASSERT_FALSE(Deliver(r, kKey, source, 0, 400).has_value());
  ASSERT_FALSE(Deliver(r, kKey, source, 800, 799).has_value());
  auto done = Deliver(r, kKey, source, 1599, 1);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(std::memcmp(done->tensor.data(), source.data(), 1600), 0);
}

TEST(TensorReassemblerTest, ShapeChangeAndOutOfRangeAreInvalidArgument) {
  TensorReassembler r(4);
  ASSERT_TRUE(r.Reserve(kKey, 4, 100, 0, 4).ok());
  auto other = r.Reserve(kKey, 100, 4, 4, 4);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other.status().message(), HasSubstr("reassembled as [4, 100]"));
  EXPECT_EQ(r.Reserve(kKey, 4, 100, 1596, 8).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Reserve(kKey, 4, 100, -4, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Reserve(kKey, 4, 100, 8, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorReassemblerTest, OpenTensorsAreCapped) {
  TensorReassembler r(3);
  for (int mb = 0; mb < 3; ++mb) {
    ASSERT_TRUE(r.Reserve(TensorKey{0, mb, 1, TensorKind::kActivation}, 2, 2, 0, 4).ok());
  }
  auto fourth = r.Reserve(TensorKey{0, 3, 1, TensorKind::kActivation}, 2, 2, 0, 4);
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(fourth.status().message(), HasSubstr("3 a striped link may reassemble at once"));
  EXPECT_EQ(r.open(), 3);
  // More fragments of an open tensor are fine.
  EXPECT_TRUE(r.Reserve(TensorKey{0, 1, 1, TensorKind::kActivation}, 2, 2, 4, 4).ok());
}

}  // namespace
}  // namespace pipetrain::wire
