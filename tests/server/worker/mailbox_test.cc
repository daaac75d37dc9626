#include "server/worker/mailbox.h"

#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::worker {
namespace {

using ::testing::HasSubstr;
using wire::TensorKey;
using wire::TensorKind;

TensorKey Key(int64_t step, int32_t mb, int32_t chunk = 0,
              TensorKind kind = TensorKind::kActivation) {
  return TensorKey{step, mb, chunk, kind};
}

math::Matrix Filled(int64_t rows, int64_t cols, float v) {
  return math::Matrix::Constant(rows, cols, v);
}

// Lets a test wait, without sleeping, until a Take is blocked on a key.
class WaitRecorder : public MailboxObserver {
 public:
  void OnWaitStart(const TensorKey& key) override {
    absl::MutexLock lock(&mu_);
    ++starts_;
    ++blocked_;
  }
  void OnWaitEnd(const TensorKey& key) override {
    absl::MutexLock lock(&mu_);
    ++ends_;
    --blocked_;
  }
  // Blocks until `n` Takes are blocked at once.
  void AwaitBlocked(int n) {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return blocked_ == n; };
    mu_.Await(absl::Condition(&reached));
  }
  int starts() const {
    absl::MutexLock lock(&mu_);
    return starts_;
  }
  int ends() const {
    absl::MutexLock lock(&mu_);
    return ends_;
  }

 private:
  // Protects the counters.
  mutable absl::Mutex mu_;
  int starts_ ABSL_GUARDED_BY(mu_) = 0;
  int ends_ ABSL_GUARDED_BY(mu_) = 0;
  int blocked_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(MailboxTest, PutThenTakeReturnsTheTensorOnce) {
  Mailbox box;
  ASSERT_TRUE(box.Put(Key(1, 0), Filled(2, 3, 1.5f)).ok());
  EXPECT_EQ(box.size(), 1);
  EXPECT_EQ(box.stored_bytes(), 2 * 3 * 4);
  absl::StatusOr<math::Matrix> m = box.Take(Key(1, 0));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->rows(), 2);
  EXPECT_EQ(m->cols(), 3);
  EXPECT_EQ((*m)(1, 2), 1.5f);
  EXPECT_EQ(box.size(), 0);
  EXPECT_EQ(box.stored_bytes(), 0);
  // Consumed: a second Take finds nothing (and, with a past deadline, says so at once).
  EXPECT_EQ(box.Take(Key(1, 0), absl::InfinitePast()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(MailboxTest, KeysDifferingInAnyFieldAreDistinct) {
  Mailbox box;
  ASSERT_TRUE(box.Put(Key(1, 0, 0, TensorKind::kActivation), Filled(1, 1, 1)).ok());
  ASSERT_TRUE(box.Put(Key(1, 0, 0, TensorKind::kGradient), Filled(1, 1, 2)).ok());
  ASSERT_TRUE(box.Put(Key(1, 0, 1, TensorKind::kActivation), Filled(1, 1, 3)).ok());
  ASSERT_TRUE(box.Put(Key(1, 1, 0, TensorKind::kActivation), Filled(1, 1, 4)).ok());
  ASSERT_TRUE(box.Put(Key(2, 0, 0, TensorKind::kActivation), Filled(1, 1, 5)).ok());
  EXPECT_EQ((*box.Take(Key(1, 0, 1, TensorKind::kActivation)))(0, 0), 3);
  EXPECT_EQ((*box.Take(Key(2, 0, 0, TensorKind::kActivation)))(0, 0), 5);
  EXPECT_EQ((*box.Take(Key(1, 0, 0, TensorKind::kGradient)))(0, 0), 2);
  EXPECT_EQ(box.size(), 2);
}

TEST(MailboxTest, DuplicatePutIsFailedPreconditionAndKeepsTheFirst) {
  Mailbox box;
  ASSERT_TRUE(box.Put(Key(3, 1, 2), Filled(1, 1, 1)).ok());
  const absl::Status s = box.Put(Key(3, 1, 2), Filled(1, 1, 2));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("activation(step=3, mb=1, chunk=2)"));
  EXPECT_EQ(box.size(), 1);
  EXPECT_EQ((*box.Take(Key(3, 1, 2)))(0, 0), 1);
}

TEST(MailboxTest, TakeBlocksUntilThePut) {
  WaitRecorder recorder;
  Mailbox box(MailboxOptions{0, &recorder});
  absl::StatusOr<math::Matrix> got;
  std::thread taker([&] { got = box.Take(Key(1, 2)); });
  recorder.AwaitBlocked(1);
  ASSERT_TRUE(box.Put(Key(1, 2), Filled(4, 1, 7)).ok());
  taker.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)(3, 0), 7);
  EXPECT_EQ(recorder.starts(), 1);
  EXPECT_EQ(recorder.ends(), 1);
}

TEST(MailboxTest, AbortWakesABlockedTakeWithItsStatusAndIsSticky) {
  WaitRecorder recorder;
  Mailbox box(MailboxOptions{0, &recorder});
  ASSERT_TRUE(box.Put(Key(1, 0), Filled(1, 1, 1)).ok());
  absl::StatusOr<math::Matrix> got;
  std::thread taker([&] { got = box.Take(Key(1, 5, 1, TensorKind::kGradient)); });
  recorder.AwaitBlocked(1);
  box.Abort(absl::UnavailableError("peer 2 lost"));
  taker.join();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(got.status().message(), HasSubstr("peer 2 lost"));
  EXPECT_THAT(got.status().message(), HasSubstr("gradient(step=1, mb=5, chunk=1)"));
  EXPECT_EQ(recorder.ends(), 1);
  // Stored tensors are dropped; later Puts and Takes fail the same way; the first status wins.
  EXPECT_EQ(box.size(), 0);
  box.Abort(absl::AbortedError("second"));
  EXPECT_EQ(box.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(box.Put(Key(1, 0), Filled(1, 1, 1)).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(box.Take(Key(1, 0)).status().code(), absl::StatusCode::kUnavailable);
  // Reset makes it usable again.
  box.Reset();
  EXPECT_TRUE(box.status().ok());
  ASSERT_TRUE(box.Put(Key(2, 0), Filled(1, 1, 9)).ok());
  EXPECT_EQ((*box.Take(Key(2, 0)))(0, 0), 9);
}

TEST(MailboxTest, AbortWithOkStatusStillAborts) {
  Mailbox box;
  box.Abort(absl::OkStatus());
  EXPECT_EQ(box.status().code(), absl::StatusCode::kAborted);
}

TEST(MailboxTest, AbortWakesEveryWaiter) {
  WaitRecorder recorder;
  Mailbox box(MailboxOptions{0, &recorder});
  absl::StatusOr<math::Matrix> a, b;
  std::thread ta([&] { a = box.Take(Key(1, 0)); });
  std::thread tb([&] { b = box.Take(Key(1, 1)); });
  recorder.AwaitBlocked(2);
  box.Abort(absl::AbortedError("step 1 aborted"));
  ta.join();
  tb.join();
  EXPECT_EQ(a.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(recorder.starts(), 2);
  EXPECT_EQ(recorder.ends(), 2);
}

TEST(MailboxTest, ASecondTakeOfTheSameKeyIsRefused) {
  WaitRecorder recorder;
  Mailbox box(MailboxOptions{0, &recorder});
  absl::StatusOr<math::Matrix> first;
  std::thread taker([&] { first = box.Take(Key(1, 0)); });
  recorder.AwaitBlocked(1);
  const absl::Status second = box.Take(Key(1, 0)).status();
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.message(), HasSubstr("another Take already waits"));
  ASSERT_TRUE(box.Put(Key(1, 0), Filled(1, 1, 1)).ok());
  taker.join();
  EXPECT_TRUE(first.ok());
}

TEST(MailboxTest, ClearStepDropsOnlyThatStep) {
  Mailbox box;
  ASSERT_TRUE(box.Put(Key(1, 0), Filled(2, 2, 1)).ok());
  ASSERT_TRUE(box.Put(Key(1, 1, 0, TensorKind::kTarget), Filled(2, 1, 1)).ok());
  ASSERT_TRUE(box.Put(Key(2, 0), Filled(1, 1, 2)).ok());
  box.ClearStep(1);
  EXPECT_EQ(box.size(), 1);
  EXPECT_EQ(box.stored_bytes(), 4);
  EXPECT_EQ(box.Take(Key(1, 0), absl::InfinitePast()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ((*box.Take(Key(2, 0)))(0, 0), 2);
  // Reset drops everything.
  ASSERT_TRUE(box.Put(Key(3, 0), Filled(1, 1, 3)).ok());
  box.Reset();
  EXPECT_EQ(box.size(), 0);
  EXPECT_EQ(box.stored_bytes(), 0);
}

TEST(MailboxTest, DeadlineExceededNamesTheKey) {
  WaitRecorder recorder;
  Mailbox box(MailboxOptions{0, &recorder});
  // A deadline already past: the answer is immediate and deterministic.
  const absl::Status s = box.Take(Key(4, 3, 2, TensorKind::kTarget), absl::InfinitePast()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("target(step=4, mb=3, chunk=2)"));
  // A short real deadline also returns (and reports the end of its wait).
  EXPECT_EQ(box.Take(Key(4, 0), absl::Now() + absl::Milliseconds(1)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(recorder.starts(), recorder.ends());
  // The key can still be delivered and taken afterwards.
  ASSERT_TRUE(box.Put(Key(4, 0), Filled(1, 1, 1)).ok());
  EXPECT_TRUE(box.Take(Key(4, 0), absl::InfinitePast()).ok());
}

TEST(MailboxTest, ByteBoundIsResourceExhausted) {
  Mailbox box(MailboxOptions{/*max_bytes=*/64, nullptr});
  ASSERT_TRUE(box.Put(Key(1, 0), Filled(4, 3, 0)).ok());       // 48 bytes
  const absl::Status s = box.Put(Key(1, 1), Filled(2, 3, 0));  // +24 > 64
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("activation(step=1, mb=1, chunk=0)"));
  EXPECT_EQ(box.stored_bytes(), 48);
  ASSERT_TRUE(box.Take(Key(1, 0)).ok());
  EXPECT_TRUE(box.Put(Key(1, 1), Filled(2, 3, 0)).ok());
  EXPECT_EQ(box.stored_bytes(), 24);
}

TEST(MailboxTest, ConcurrentProducersAndAConsumer) {
  // Two link threads deliver interleaved keys while the compute thread takes them in its own
  // order; every tensor arrives intact exactly once.
  Mailbox box;
  constexpr int kPerProducer = 200;
  auto produce = [&box](int parity) {
    for (int i = parity; i < 2 * kPerProducer; i += 2) {
      EXPECT_TRUE(box.Put(Key(1, i), Filled(1, 2, static_cast<float>(i))).ok());
    }
  };
  std::thread p0(produce, 0);
  std::thread p1(produce, 1);
  for (int i = 2 * kPerProducer - 1; i >= 0; --i) {
    absl::StatusOr<math::Matrix> m = box.Take(Key(1, i));
    if (!m.ok()) {
      ADD_FAILURE() << m.status();
      break;
    }
    EXPECT_EQ((*m)(0, 1), static_cast<float>(i));
  }
  p0.join();
  p1.join();
  EXPECT_EQ(box.size(), 0);
}

// TakeAny: the first listed key present wins; a TakeAny ends with the Put of any of its keys
// (whether it came before or during the wait), with Notify (nullopt), or with the abort status;
// its waits are not the observer's (it counts the compute thread's).
TEST(MailboxTest, TakeAnyReturnsWhicheverKeyArrives) {
  WaitRecorder recorder;
  Mailbox box(MailboxOptions{0, &recorder});
  ASSERT_TRUE(box.Put(Key(1, 3), Filled(1, 1, 3)).ok());
  ASSERT_TRUE(box.Put(Key(1, 2), Filled(1, 1, 2)).ok());
  auto got = box.TakeAny({Key(1, 9), Key(1, 2), Key(1, 3)}, absl::InfiniteFuture(), box.notices());
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status();
  EXPECT_EQ((*got)->first, Key(1, 2));
  EXPECT_EQ((*got)->second(0, 0), 2);
  EXPECT_EQ(box.size(), 1);

  absl::StatusOr<std::optional<Mailbox::Entry>> blocked;
  std::thread taker([&] {
    blocked = box.TakeAny({Key(2, 0), Key(2, 1)}, absl::InfiniteFuture(), box.notices());
  });
  ASSERT_TRUE(box.Put(Key(2, 1), Filled(2, 1, 5)).ok());
  taker.join();
  ASSERT_TRUE(blocked.ok() && blocked->has_value()) << blocked.status();
  EXPECT_EQ((*blocked)->first, Key(2, 1));
  EXPECT_EQ(recorder.starts(), 0);
  EXPECT_EQ(recorder.ends(), 0);
}

// A Notify after the count the TakeAny was given ends it, before or during its wait.
TEST(MailboxTest, NotifyEndsATakeAnyWithNothing) {
  Mailbox box;
  const int64_t seen = box.notices();
  absl::StatusOr<std::optional<Mailbox::Entry>> got;
  std::thread taker([&] { got = box.TakeAny({Key(1, 0)}, absl::InfiniteFuture(), seen); });
  box.Notify();
  taker.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->has_value());
  // A notice before the call (a count older than notices()) returns at once, as does a deadline.
  got = box.TakeAny({Key(1, 0)}, absl::InfiniteFuture(), seen);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->has_value());
  got = box.TakeAny({Key(1, 0)}, absl::Now(), box.notices());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->has_value());
  // The keys are free again for a Take.
  ASSERT_TRUE(box.Put(Key(1, 0), Filled(1, 1, 1)).ok());
  EXPECT_TRUE(box.Take(Key(1, 0)).ok());
}

TEST(MailboxTest, TakeAnyRefusesBadKeysAndEndsOnAbort) {
  Mailbox box;
  EXPECT_EQ(box.TakeAny({}, absl::Now(), 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(box.TakeAny({Key(1, 0), Key(1, 0)}, absl::Now(), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  box.Abort(absl::UnavailableError("link lost"));
  auto got = box.TakeAny({Key(1, 0), Key(1, 1)}, absl::InfiniteFuture(), box.notices());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(got.status().message(), HasSubstr("link lost"));
}

}  // namespace
}  // namespace pipetrain::worker
