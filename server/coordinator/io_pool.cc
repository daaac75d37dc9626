#include "server/coordinator/io_pool.h"

#include <algorithm>

namespace pipetrain::coordinator {

IoPool::IoPool(int threads) {
  for (int i = 0; i < std::max(threads, 1); ++i) threads_.push_back(std::make_unique<OpThread>());
}

OpThread* IoPool::Strand() {
  return threads_[next_.fetch_add(1, std::memory_order_relaxed) % threads_.size()].get();
}

}  // namespace pipetrain::coordinator
