// FeedLink: a data link from the coordinator to the owner of the model's first or last chunk,
// over which a step's inputs and targets go out (docs/architecture.md, "One step"). The core
// dials them through a FeedLinkFactory; the gRPC shell's factory opens a link::PeerLink
// (grpc_feed_link.h), tests use an in-memory one.
#ifndef PIPETRAIN_SERVER_COORDINATOR_FEED_LINK_H_
#define PIPETRAIN_SERVER_COORDINATOR_FEED_LINK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/math/tensor.h"
#include "common/wire/tensor_key.h"

namespace pipetrain::coordinator {

class FeedLink {
 public:
  virtual ~FeedLink() = default;

  // Queues `tensor` under `key` and returns at once; the tensor must not change afterwards.
  // Errors: the link's failure, or FAILED_PRECONDITION once it was shut down. Thread-safe.
  virtual absl::Status Send(const wire::TensorKey& key,
                            std::shared_ptr<const math::Matrix> tensor) = 0;

  // OK while the link is healthy, else its failure. Thread-safe.
  virtual absl::Status status() const = 0;

  // Closes the link; queued tensors are dropped and no callback runs after it returns (it may
  // wait for one in progress, so never call it with a lock an on_error callback takes).
  // Idempotent.
  virtual void Shutdown() = 0;
};

// Who a feed link is for: the job, its generation of ranks and the link secret of that
// generation, and the rank it reaches.
struct FeedTarget {
  std::string job;
  int64_t generation = 0;
  std::string secret;
  int rank = 0;
  std::string address;  // the rank's StageWorker address.
  int microbatches = 0;
  int chunks = 0;
  // Chunks of one copy of the model: `chunks`, or S when the job holds two copies of S stages
  // (dualpipe's bidirectional placement).
  int copy_chunks = 0;
};

// Where micro-batch `mb` enters and leaves the model: the rank and chunk its input goes to, and
// those of its target (the chunk that computes its loss).
struct FeedRoute {
  const FeedTarget* input = nullptr;
  int input_chunk = 0;
  const FeedTarget* target = nullptr;
  int target_chunk = 0;
};

// The route of micro-batch `mb` of a job fed through `first` (the owner of chunk 0) and `last`
// (the owner of chunk copy_chunks - 1): chunk 0 to chunk copy_chunks - 1, except, with two
// copies of the stages, micro-batches [M/2, M), which enter the up copy at chunk S on `last`'s
// rank and leave it at chunk 2S - 1 on `first`'s (docs/schedules.md, "DualPipe").
inline FeedRoute RouteOf(const FeedTarget& first, const FeedTarget& last, int mb) {
  if (first.copy_chunks < first.chunks && mb >= first.microbatches / 2) {
    return {&last, first.copy_chunks, &first, first.chunks - 1};
  }
  return {&first, 0, &last, first.copy_chunks - 1};
}

class FeedLinkFactory {
 public:
  virtual ~FeedLinkFactory() = default;

  // Opens a link to `target`; `on_error` is called (once, on any thread, possibly with the
  // link's own lock held: it must not block) when the link fails later. The link is usable at
  // once (the handshake completes asynchronously). INVALID_ARGUMENT for a bad target.
  virtual absl::StatusOr<std::unique_ptr<FeedLink>> Dial(
      const FeedTarget& target, std::function<void(const absl::Status&)> on_error) = 0;
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_FEED_LINK_H_
