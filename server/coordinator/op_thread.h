// OpThread: a thread that runs posted tasks one at a time, in order — the coordinator gives each
// job one, so that a job's blocking operations (assignment, steps, checkpoints) are serialised
// while different jobs never wait for each other.
#ifndef PIPETRAIN_SERVER_COORDINATOR_OP_THREAD_H_
#define PIPETRAIN_SERVER_COORDINATOR_OP_THREAD_H_

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace pipetrain::coordinator {

class OpThread {
 public:
  OpThread();
  // Closes (see Close) and joins the thread. Not from the thread itself.
  ~OpThread();
  OpThread(const OpThread&) = delete;
  OpThread& operator=(const OpThread&) = delete;

  // Queues `task` behind every task posted before it. Returns false (and drops the task) once
  // the thread was closed. Thread-safe.
  bool Post(std::function<void()> task);

  // No more tasks are accepted; the thread runs those already queued and exits. Thread-safe,
  // idempotent.
  void Close();

  // True once the thread was closed and has run its last task (Join will not block).
  bool Finished();

 private:
  void Loop();

  // Protects the queue and the flags.
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the members above exist.
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_OP_THREAD_H_
