#include "server/coordinator/op_thread.h"

#include <utility>

namespace pipetrain::coordinator {

OpThread::OpThread() : thread_([this] { Loop(); }) {}

OpThread::~OpThread() {
  Close();
  thread_.join();
}

bool OpThread::Post(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  queue_.push_back(std::move(task));
  return true;
}

void OpThread::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

bool OpThread::Finished() {
  absl::MutexLock lock(&mu_);
  return finished_;
}

void OpThread::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) {  // closed and drained.
        finished_ = true;
        return;
      }
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace pipetrain::coordinator
