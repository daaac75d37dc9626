// Early-return helpers for absl::Status / absl::StatusOr (bookworm's Abseil ships neither).
#ifndef PIPETRAIN_COMMON_UTIL_STATUS_MACROS_H_
#define PIPETRAIN_COMMON_UTIL_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status) once and returns it from the enclosing function if not OK.
#define PT_RETURN_IF_ERROR(expr)                               \
  do {                                                         \
    ::absl::Status pt_status_internal_ = (expr);               \
    if (!pt_status_internal_.ok()) return pt_status_internal_; \
  } while (false)

#define PT_STATUS_MACROS_CONCAT_INNER_(x, y) x##y
#define PT_STATUS_MACROS_CONCAT_(x, y) PT_STATUS_MACROS_CONCAT_INNER_(x, y)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status from the enclosing
// function, otherwise moves the value into `lhs` (a declaration such as `auto x` or an lvalue).
#define PT_ASSIGN_OR_RETURN(lhs, rexpr) \
  PT_ASSIGN_OR_RETURN_IMPL_(PT_STATUS_MACROS_CONCAT_(pt_statusor_, __LINE__), lhs, rexpr)

#define PT_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr)    \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // PIPETRAIN_COMMON_UTIL_STATUS_MACROS_H_
