// Status propagation macros. Abseil 20220623 ships absl::Status but not its macros, so Tessera
// defines them once here for every module.
#ifndef TESSERA_STATUS_MACROS_H_
#define TESSERA_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns `expr` from the enclosing function when it is not OK.
#define TESSERA_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::absl::Status _tessera_status = (expr);           \
    if (!_tessera_status.ok()) return _tessera_status; \
  } while (0)

#define TESSERA_STATUS_CONCAT_INNER_(a, b) a##b
#define TESSERA_STATUS_CONCAT_(a, b) TESSERA_STATUS_CONCAT_INNER_(a, b)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status, otherwise moves the value
// into `lhs`, which may be a declaration: TESSERA_ASSIGN_OR_RETURN(auto x, MakeX());
#define TESSERA_ASSIGN_OR_RETURN(lhs, rexpr) \
  TESSERA_ASSIGN_OR_RETURN_IMPL_(TESSERA_STATUS_CONCAT_(_tessera_statusor_, __LINE__), lhs, rexpr)

// `statusor` names a variable and `lhs` may declare one: neither can take parentheses.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define TESSERA_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = std::move(statusor).value()
// NOLINTEND(bugprone-macro-parentheses)

#endif  // TESSERA_STATUS_MACROS_H_
