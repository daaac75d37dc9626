// IoPool: a few threads for the gRPC shell's blocking disk I/O (checkpoint uploads and
// downloads), so that no gRPC callback thread waits on a disk. Each stream takes one strand (a
// thread, round-robin): its tasks run in order, different streams spread over the threads.
#ifndef PIPETRAIN_SERVER_COORDINATOR_IO_POOL_H_
#define PIPETRAIN_SERVER_COORDINATOR_IO_POOL_H_

#include <atomic>
#include <memory>
#include <vector>

#include "server/coordinator/op_thread.h"

namespace pipetrain::coordinator {

class IoPool {
 public:
  // `threads` >= 1.
  explicit IoPool(int threads);
  // Runs every queued task, then joins the threads.
  ~IoPool() = default;
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  // A strand for one stream; valid as long as the pool. Thread-safe.
  OpThread* Strand();

 private:
  std::vector<std::unique_ptr<OpThread>> threads_;
  std::atomic<size_t> next_{0};
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_IO_POOL_H_
