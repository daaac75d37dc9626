#include "server/worker/link_span_log.h"

#include <chrono>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain::worker {
namespace {

using Clock = LinkSpanLog::Clock;
using wire::TensorKey;
using wire::TensorKind;

link::LinkTransfer Transfer(bool send, const TensorKey& key, Clock::time_point start,
                            Clock::time_point end) {
  return link::LinkTransfer{
      send ? link::LinkTransfer::Direction::kSend : link::LinkTransfer::Direction::kReceive, key,
      64, start, end};
}

TEST(LinkSpanLogTest, StepsSpansAreRelativeClippedSortedAndTakenOnce) {
  const Clock::time_point t0 = Clock::now();
  const auto us = [t0](int n) { return t0 + std::chrono::microseconds(n); };
  LinkSpanLog log;
  const TensorKey act{3, 0, 1, TensorKind::kActivation};
  const TensorKey act1{3, 1, 1, TensorKind::kActivation};
  const TensorKey input{3, 0, 0, TensorKind::kInput};
  const TensorKey next{4, 0, 0, TensorKind::kInput};
  const TensorKey old{2, 0, 0, TensorKind::kInput};
  log.SendQueued("stage/1", act, 64, us(10));
  log.SendQueued("stage/1", act1, 64, us(20));  // still being written when the step is taken
  log.Record("stage/1", Transfer(true, act, us(11), us(30)));
  log.Record("stage/2", Transfer(true, act1, us(21), us(25)));       // another peer: no such send
  log.Record("coordinator", Transfer(false, input, us(-5), us(2)));  // began before the step
  log.Record("coordinator", Transfer(false, next, us(40), us(41)));  // the next step's
  log.Record("coordinator", Transfer(false, old, us(1), us(2)));     // an earlier step's

  const std::vector<LinkSpanTiming> spans = log.TakeStep(3, t0, us(50));
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_FALSE(spans[0].send);
  EXPECT_EQ(spans[0].peer, "coordinator");
  EXPECT_EQ(spans[0].start, absl::ZeroDuration());
  EXPECT_EQ(spans[0].end, absl::Microseconds(2));
  EXPECT_TRUE(spans[0].complete);
  EXPECT_TRUE(spans[1].send);
  EXPECT_EQ(spans[1].key, act);
  EXPECT_EQ(spans[1].start, absl::Microseconds(10));
  EXPECT_EQ(spans[1].end, absl::Microseconds(30));
  EXPECT_TRUE(spans[1].complete);
  EXPECT_EQ(spans[2].key, act1);
  EXPECT_EQ(spans[2].end, absl::Microseconds(50)) << "open: ends at the report";
  EXPECT_FALSE(spans[2].complete);

  // Taken once; a late completion of a taken send is ignored; the next step's span is kept and
  // the earlier step's was dropped.
  log.Record("stage/1", Transfer(true, act1, us(21), us(60)));
  EXPECT_TRUE(log.TakeStep(3, t0, us(70)).empty());
  const std::vector<LinkSpanTiming> later = log.TakeStep(4, us(35), us(70));
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].key, next);
  EXPECT_EQ(later[0].start, absl::Microseconds(5));
  log.Record("coordinator", Transfer(false, old, us(1), us(2)));
  log.Clear();
  EXPECT_TRUE(log.TakeStep(2, t0, us(70)).empty());
}

}  // namespace
}  // namespace pipetrain::worker
