// Early-return helpers for absl::Status and absl::StatusOr.
#ifndef GPUMOVE_DAEMON_COMMON_STATUS_MACROS_H_
#define GPUMOVE_DAEMON_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define GPUMOVE_CONCAT_INNER_(a, b) a##b
#define GPUMOVE_CONCAT_(a, b) GPUMOVE_CONCAT_INNER_(a, b)

// Returns the status of `expr` from the enclosing function when it is not OK.
#define GPUMOVE_RETURN_IF_ERROR(expr)                 \
  do {                                                \
    ::absl::Status gpumove_status_ = (expr);          \
    if (!gpumove_status_.ok()) return gpumove_status_; \
  } while (0)

// Evaluates a StatusOr; returns its status on error, else moves the value into `lhs`
// (which may be a declaration, e.g. `auto x`).
#define GPUMOVE_ASSIGN_OR_RETURN(lhs, rexpr) \
  GPUMOVE_ASSIGN_OR_RETURN_IMPL_(GPUMOVE_CONCAT_(gpumove_statusor_, __LINE__), lhs, rexpr)

#define GPUMOVE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = *std::move(statusor)

#endif  // GPUMOVE_DAEMON_COMMON_STATUS_MACROS_H_
