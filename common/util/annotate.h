// Annotate: adds where an error happened to its message, keeping its code.
#ifndef PIPETRAIN_COMMON_UTIL_ANNOTATE_H_
#define PIPETRAIN_COMMON_UTIL_ANNOTATE_H_

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace pipetrain::util {

// `status` with `context` prepended to its message ("context: message"), same code; OK stays OK.
inline absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace pipetrain::util

#endif  // PIPETRAIN_COMMON_UTIL_ANNOTATE_H_
