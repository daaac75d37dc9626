#include "common/util/heap_tuning.h"

#include <malloc.h>

#include "absl/strings/str_cat.h"

namespace pipetrain::util {

absl::Status KeepLargeBuffersOnHeap() {
  if (kSanitizerAllocator) return absl::OkStatus();
  // mallopt returns 1 on success, 0 on error.
  if (mallopt(M_MMAP_THRESHOLD, kHeapMmapThresholdBytes) != 1) {
    return absl::InternalError(
        absl::StrCat("mallopt(M_MMAP_THRESHOLD, ", kHeapMmapThresholdBytes, ") failed"));
  }
  if (mallopt(M_TRIM_THRESHOLD, kHeapTrimThresholdBytes) != 1) {
    return absl::InternalError(
        absl::StrCat("mallopt(M_TRIM_THRESHOLD, ", kHeapTrimThresholdBytes, ") failed"));
  }
  return absl::OkStatus();
}

void ReturnFreeHeapToKernel() {
  if (kSanitizerAllocator) return;
  malloc_trim(0);
}

}  // namespace pipetrain::util
