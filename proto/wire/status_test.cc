#include "tessera/wire/status.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace tessera::wire {
namespace {

TEST(WireStatus, EveryCodeKeepsItsNumberAndMessageBothWays) {
  for (int code = 1; code <= 16; ++code) {
    const std::string message = absl::StrCat("message ", code, " with \xc3\xa9 and \n");
    const absl::Status absl_status(static_cast<absl::StatusCode>(code), message);
    const grpc::Status grpc_status = ToGrpcStatus(absl_status);
    EXPECT_EQ(static_cast<int>(grpc_status.error_code()), code);
    EXPECT_EQ(grpc_status.error_message(), message);
    const absl::Status back = FromGrpcStatus(grpc_status);
    EXPECT_EQ(back, absl_status) << code;

    const absl::Status from_grpc =
        FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(code), message));
    EXPECT_EQ(static_cast<int>(from_grpc.code()), code);
    EXPECT_EQ(from_grpc.message(), message);
  }
}

TEST(WireStatus, NamedCodesMatch) {
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::NOT_FOUND, "x")).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "x")).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "x")).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(ToGrpcStatus(absl::InvalidArgumentError("x")).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ToGrpcStatus(absl::UnavailableError("x")).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ToGrpcStatus(absl::DeadlineExceededError("x")).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
}

TEST(WireStatus, OkCarriesNoMessage) {
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  const absl::Status ok = FromGrpcStatus(grpc::Status(grpc::StatusCode::OK, "ignored"));
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.message(), "");
  const grpc::Status grpc_ok = ToGrpcStatus(absl::OkStatus());
  EXPECT_TRUE(grpc_ok.ok());
  EXPECT_EQ(grpc_ok.error_message(), "");
}

TEST(WireStatus, UndefinedGrpcCodeReadsAsUnknown) {
  const absl::Status status = FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(42), "m"));
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(status.message(), "m");
}

}  // namespace
}  // namespace tessera::wire
