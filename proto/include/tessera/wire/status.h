// absl::Status ↔ grpc::Status, for every process that speaks tessera.v1: the server's handlers,
// the router's calls to shard nodes, a shard node's calls to another, and the C++ client. absl's
// canonical codes are gRPC's codes (the same numbers, 0 … 16), so each direction keeps the code and
// the message as they are; an OK status carries no message either way. Stateless, thread-safe.
#ifndef TESSERA_WIRE_STATUS_H_
#define TESSERA_WIRE_STATUS_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"

namespace tessera::wire {

// The gRPC status a call finishes with: the same code and message (OK for OK).
grpc::Status ToGrpcStatus(const absl::Status& status);

// The absl status of a finished call: the same code and message; OK for OK whatever message it
// carries. A code gRPC does not define reads back as UNKNOWN (absl::Status::code()).
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace tessera::wire

#endif  // TESSERA_WIRE_STATUS_H_
