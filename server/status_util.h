// The one place where absl::Status becomes grpc::Status. The codes are the same numbers (absl's
// canonical codes are gRPC's), so the mapping is a cast plus the message.
#ifndef TESSERA_SERVER_STATUS_UTIL_H_
#define TESSERA_SERVER_STATUS_UTIL_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"

namespace tessera::server {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace tessera::server

#endif  // TESSERA_SERVER_STATUS_UTIL_H_
