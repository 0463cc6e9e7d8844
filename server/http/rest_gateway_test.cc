#include "server/http/rest_gateway.h"

#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <cstring>

#include "server/http/json_mapping.h"
#include "server/http/openapi.h"
#include "tessera/v1/ingest.pb.h"
#include "tessera/v1/query.pb.h"

namespace tessera::server {
namespace {

using ::testing::HasSubstr;

TEST(RestGateway, HttpStatusFollowsGooglesMapping) {
  const std::vector<std::pair<absl::StatusCode, int>> expected = {
      {absl::StatusCode::kOk, 200},
      {absl::StatusCode::kInvalidArgument, 400},
      {absl::StatusCode::kFailedPrecondition, 400},
      {absl::StatusCode::kOutOfRange, 400},
      {absl::StatusCode::kUnauthenticated, 401},
      {absl::StatusCode::kPermissionDenied, 403},
      {absl::StatusCode::kNotFound, 404},
      {absl::StatusCode::kAlreadyExists, 409},
      {absl::StatusCode::kAborted, 409},
      {absl::StatusCode::kResourceExhausted, 429},
      {absl::StatusCode::kCancelled, 499},
      {absl::StatusCode::kUnknown, 500},
      {absl::StatusCode::kInternal, 500},
      {absl::StatusCode::kDataLoss, 500},
      {absl::StatusCode::kUnimplemented, 501},
      {absl::StatusCode::kUnavailable, 503},
      {absl::StatusCode::kDeadlineExceeded, 504},
  };
  for (const auto& [code, status] : expected) {
    EXPECT_EQ(HttpStatusOf(code), status) << absl::StatusCodeToString(code);
  }
}

TEST(RestGateway, ErrorBodyHasCodeMessageStatusDetails) {
  google::protobuf::Value body;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  ErrorJson(absl::NotFoundError("collection 'x' not found")), &body)
                  .ok());
  const auto& error = body.struct_value().fields().at("error").struct_value().fields();
  EXPECT_EQ(error.at("code").number_value(), 404);
  EXPECT_EQ(error.at("message").string_value(), "collection 'x' not found");
  EXPECT_EQ(error.at("status").string_value(), "NOT_FOUND");
  EXPECT_EQ(error.at("details").list_value().values_size(), 0);
}

TEST(JsonMapping, MatrixAsNestedArraysEqualsPackedBytes) {
  v1::SearchBatchRequest request;
  ASSERT_TRUE(JsonToMessage(R"({"searches": [{"collection": "c", "k": 3,
                                  "query": [[1, 2.5, -3], [0, 0.125, 1e3]]}]})",
                            &request)
                  .ok());
  const v1::Matrix& query = request.searches(0).query();
  EXPECT_EQ(query.rows(), 2u);
  EXPECT_EQ(query.cols(), 3u);
  EXPECT_EQ(query.dtype(), v1::DTYPE_FLOAT32);
  const float expected[] = {1, 2.5f, -3, 0, 0.125f, 1000};
  ASSERT_EQ(query.data().size(), sizeof(expected));
  float stored[6];
  std::memcpy(stored, query.data().data(), sizeof(stored));
  EXPECT_THAT(stored, ::testing::ElementsAreArray(expected));
  // The proto form of the same matrix parses to the same message.
  v1::SearchBatchRequest packed;
  ASSERT_TRUE(JsonToMessage(MessageToJson(request), &packed).ok());
  EXPECT_EQ(packed.SerializeAsString(), request.SerializeAsString());
}

TEST(JsonMapping, BadMatricesNameTheField) {
  v1::SearchBatchRequest request;
  absl::Status status = JsonToMessage(R"({"searches": [{}, {"query": [[1, 2], [3]]}]})", &request);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("searches[1].query: row 1 holds 1 numbers, row 0 holds 2"));
  status = JsonToMessage(R"({"searches": [{"query": [[1, "a"]]}]})", &request);
  EXPECT_THAT(status.message(), HasSubstr("searches[0].query[0][1]: a string, expected a number"));
  status = JsonToMessage(R"({"searches": [{"query": [1, 2]}]})", &request);
  EXPECT_THAT(status.message(), HasSubstr("searches[0].query[0]: a number, expected a row"));
  status = JsonToMessage(R"({"serches": []})", &request);
  EXPECT_THAT(status.message(), HasSubstr("serches"));
  status = JsonToMessage("[1]", &request);
  EXPECT_THAT(status.message(), HasSubstr("an array, expected an object"));
  status = JsonToMessage("{", &request);
  EXPECT_THAT(status.message(), HasSubstr("not JSON"));
}

TEST(JsonMapping, IdsAreText) {
  v1::DeleteRequest request;
  ASSERT_TRUE(JsonToMessage(R"({"collection": "c", "ids": ["doc/1", "é"]})", &request).ok());
  ASSERT_EQ(request.ids_size(), 2);
  EXPECT_EQ(request.ids(0), "doc/1");
  EXPECT_EQ(request.ids(1), "\xc3\xa9");
  v1::SearchResponse response;
  response.add_hits()->set_id("doc/1");
  response.mutable_hits(0)->set_score(0.5f);
  EXPECT_THAT(MessageToJson(response), HasSubstr(R"("id":"doc/1")"));
  EXPECT_THAT(MessageToJson(response), HasSubstr(R"("score":0.5)"));
}

TEST(OpenApi, EveryRouteHasAnOperationOnAKnownRpc) {
  google::protobuf::Value document;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(OpenApiDocument(RestRoutes()), &document).ok());
  const auto& fields = document.struct_value().fields();
  EXPECT_EQ(fields.at("openapi").string_value(), "3.0.3");
  const auto& paths = fields.at("paths").struct_value().fields();
  const auto& schemas =
      fields.at("components").struct_value().fields().at("schemas").struct_value().fields();
  for (const RestRoute& route : RestRoutes()) {
    const auto* method = FindRpc(route.rpc);
    ASSERT_NE(method, nullptr) << route.rpc;
    ASSERT_TRUE(paths.contains(route.path)) << route.path;
    std::string verb = route.verb;
    for (char& c : verb) c = static_cast<char>(std::tolower(c));
    EXPECT_TRUE(paths.at(route.path).struct_value().fields().contains(verb)) << route.path;
    EXPECT_TRUE(schemas.contains(method->input_type()->full_name()));
    EXPECT_TRUE(schemas.contains(method->output_type()->full_name()));
  }
}

}  // namespace
}  // namespace tessera::server
