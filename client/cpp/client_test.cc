// Tests of tessera::client::Client without a Tessera server: matrix packing (fp32/fp16,
// little-endian), request building and response decoding, gRPC → absl status mapping, batching,
// option checks, and the Upsert stream against a small in-process fake IngestService.
#include "client/cpp/client.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Bytes(std::initializer_list<int> values) {
  std::string out;
  for (int v : values) out.push_back(static_cast<char>(v));
  return out;
}

TEST(TokenMatrix, PacksFloat32LittleEndian) {
  const std::vector<float> values = {1.0f, -2.0f, 0.5f, 0.0f};
  TokenMatrix matrix = TokenMatrix::FromFloat32(2, 2, values);
  EXPECT_EQ(matrix.rows, 2u);
  EXPECT_EQ(matrix.cols, 2u);
  EXPECT_EQ(matrix.dtype, v1::DTYPE_FLOAT32);
  EXPECT_EQ(matrix.data, Bytes({0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0, 0x00, 0x00, 0x00,
                                0x3f, 0x00, 0x00, 0x00, 0x00}));
  EXPECT_TRUE(matrix.Validate().ok());
  auto decoded = matrix.ToFloat32();
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, values);
}

TEST(TokenMatrix, PacksFloat16LittleEndian) {
  const std::vector<Float16> values = {Float16{0x3c00}, Float16{0xc000}, Float16{0x3800}};
  TokenMatrix matrix = TokenMatrix::FromFloat16(1, 3, values);
  EXPECT_EQ(matrix.dtype, v1::DTYPE_FLOAT16);
  EXPECT_EQ(matrix.data, Bytes({0x00, 0x3c, 0x00, 0xc0, 0x00, 0x38}));
  auto decoded = matrix.ToFloat32();
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_THAT(*decoded, ElementsAre(1.0f, -2.0f, 0.5f));
}

TEST(TokenMatrix, Float32AsFloat16RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and the next fp16 (1 + 2^-10): ties go to even (1.0).
  const std::vector<float> values = {1.0f, 1.0f + std::ldexp(1.0f, -11), 0.333333f, 1e6f};
  TokenMatrix matrix = TokenMatrix::Float32AsFloat16(2, 2, values);
  EXPECT_EQ(matrix.dtype, v1::DTYPE_FLOAT16);
  ASSERT_EQ(matrix.data.size(), 8u);
  auto decoded = matrix.ToFloat32();
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ((*decoded)[0], 1.0f);
  EXPECT_EQ((*decoded)[1], 1.0f);
  EXPECT_NEAR((*decoded)[2], 0.333333f, 1e-3f);
  EXPECT_TRUE(std::isinf((*decoded)[3]));  // beyond fp16's range
}

TEST(TokenMatrix, RoundTripsManyValuesThroughBothDtypes) {
  std::vector<float> values(7 * 33);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(0.37f * i) * 3.0f;
  auto fp32 = TokenMatrix::FromFloat32(7, 33, values).ToFloat32();
  ASSERT_TRUE(fp32.ok());
  EXPECT_EQ(*fp32, values);
  auto fp16 = TokenMatrix::Float32AsFloat16(7, 33, values).ToFloat32();
  ASSERT_TRUE(fp16.ok());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ((*fp16)[i], HalfToFloat(FloatToHalf(values[i]))) << i;
  }
}

TEST(TokenMatrix, ValidateRejectsWrongSizeAndUnknownDtype) {
  TokenMatrix short_data =
      TokenMatrix::FromPackedBytes(2, 3, v1::DTYPE_FLOAT32, std::string(20, 0));
  absl::Status status = short_data.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "matrix: 20 bytes of data, expected rows 2 × cols 3 × 4 = 24");
  EXPECT_FALSE(short_data.ToFloat32().ok());

  TokenMatrix unknown =
      TokenMatrix::FromPackedBytes(1, 1, v1::DTYPE_UNSPECIFIED, std::string(4, 0));
  EXPECT_EQ(unknown.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.Validate().message(), HasSubstr("DTYPE_FLOAT32"));

  // More values than rows × cols is caught too.
  const std::vector<float> five(5, 1.0f);
  EXPECT_FALSE(TokenMatrix::FromFloat32(2, 2, five).Validate().ok());
}

// 2^31 × 2^31 fp32 values are 2^64 bytes, which wraps to 0 in 64 bits: an empty matrix of that
// shape must not validate (ToFloat32 would then allocate 2^62 floats).
TEST(TokenMatrix, ValidateDoesNotOverflow) {
  const uint32_t big = uint32_t{1} << 31;
  const TokenMatrix huge = TokenMatrix::FromPackedBytes(big, big, v1::DTYPE_FLOAT32, "");
  EXPECT_EQ(huge.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(huge.Validate().message(), HasSubstr("over 2^64"));
  EXPECT_EQ(huge.ToFloat32().status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenMatrix, ProtoRoundTrip) {
  const std::vector<float> values = {0.25f, -0.75f, 3.0f, 4.0f, 5.0f, 6.0f};
  TokenMatrix matrix = TokenMatrix::FromFloat32(3, 2, values);
  v1::Matrix proto = matrix.ToProto();
  EXPECT_EQ(proto.rows(), 3u);
  EXPECT_EQ(proto.cols(), 2u);
  EXPECT_EQ(proto.dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(proto.data(), matrix.data);
  auto back = TokenMatrix::FromProto(std::move(proto));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data, matrix.data);

  v1::Matrix bad;
  bad.set_rows(2);
  bad.set_cols(2);
  bad.set_dtype(v1::DTYPE_FLOAT16);
  bad.set_data(std::string(6, 0));
  EXPECT_EQ(TokenMatrix::FromProto(std::move(bad)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

DocumentInput MakeDocument(const std::string& id, uint32_t rows, uint32_t cols, float fill) {
  DocumentInput document;
  document.id = id;
  document.tokens = TokenMatrix::FromFloat32(rows, cols, std::vector<float>(rows * cols, fill));
  return document;
}

TEST(Requests, BuildUpsertRequestCarriesEveryField) {
  std::vector<DocumentInput> documents;
  documents.push_back(MakeDocument("a", 2, 4, 0.5f));
  documents.push_back(MakeDocument("b", 6, 4, -1.0f));
  documents[1].layout = PatchLayout{2, 2, 1, 1};
  documents[1].attributes = {{"year", int64_t{2021}}, {"score", 0.25}, {"lang", std::string("en")}};
  v1::UpsertRequest request = internal::BuildUpsertRequest("papers", std::move(documents));

  EXPECT_EQ(request.collection(), "papers");
  ASSERT_EQ(request.documents_size(), 2);
  const v1::Document& a = request.documents(0);
  EXPECT_EQ(a.id(), "a");
  EXPECT_EQ(a.tokens().rows(), 2u);
  EXPECT_EQ(a.tokens().cols(), 4u);
  EXPECT_EQ(a.tokens().dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(a.tokens().data().size(), 2u * 4 * 4);
  EXPECT_FALSE(a.has_layout());
  EXPECT_TRUE(a.attributes().empty());

  const v1::Document& b = request.documents(1);
  ASSERT_TRUE(b.has_layout());
  EXPECT_EQ(b.layout().rows(), 2u);
  EXPECT_EQ(b.layout().cols(), 2u);
  EXPECT_EQ(b.layout().prefix_tokens(), 1u);
  EXPECT_EQ(b.layout().suffix_tokens(), 1u);
  ASSERT_EQ(b.attributes().size(), 3u);
  EXPECT_EQ(b.attributes().at("year").int_value(), 2021);
  EXPECT_EQ(b.attributes().at("score").double_value(), 0.25);
  EXPECT_EQ(b.attributes().at("lang").string_value(), "en");
}

TEST(Requests, BuildSearchRequestCarriesOptionsAndFilter) {
  TokenMatrix query = TokenMatrix::FromFloat32(1, 2, std::vector<float>{1.0f, 0.0f});
  SearchOptions options;
  options.k = 7;
  options.num_candidates = 70;
  options.per_token_candidates = 128;
  options.nprobe = 16;
  options.exhaustive = true;
  options.explain = true;
  options.filter.all_of.push_back({"year", FilterCondition::Op::kGe, {int64_t{2020}}});
  options.filter.all_of.push_back(
      {"lang", FilterCondition::Op::kIn, {std::string("en"), std::string("fr")}});
  v1::SearchRequest request = internal::BuildSearchRequest("papers", query, options);

  EXPECT_EQ(request.collection(), "papers");
  EXPECT_EQ(request.query().data(), query.data);
  EXPECT_EQ(request.k(), 7u);
  EXPECT_EQ(request.num_candidates(), 70u);
  EXPECT_EQ(request.per_token_candidates(), 128u);
  EXPECT_EQ(request.nprobe(), 16u);
  EXPECT_TRUE(request.exhaustive());
  EXPECT_TRUE(request.explain());
  ASSERT_EQ(request.filter().all_of_size(), 2);
  EXPECT_EQ(request.filter().all_of(0).field(), "year");
  EXPECT_EQ(request.filter().all_of(0).op(), v1::Condition::OP_GE);
  EXPECT_EQ(request.filter().all_of(0).values(0).int_value(), 2020);
  EXPECT_EQ(request.filter().all_of(1).op(), v1::Condition::OP_IN);
  ASSERT_EQ(request.filter().all_of(1).values_size(), 2);
  EXPECT_EQ(request.filter().all_of(1).values(1).string_value(), "fr");

  v1::SearchRequest unfiltered = internal::BuildSearchRequest("papers", query, SearchOptions{});
  EXPECT_FALSE(unfiltered.has_filter());
  EXPECT_EQ(unfiltered.k(), 10u);
}

// Sparse vectors and the hybrid options reach the wire; lane scores come back.
TEST(Requests, SparseAndHybridRoundTrip) {
  std::vector<DocumentInput> documents;
  documents.push_back(MakeDocument("a", 2, 4, 0.5f));
  documents[0].sparse = SparseVector{{9, 2}, {1.0f, 3.0f}};
  documents.push_back(MakeDocument("b", 2, 4, 0.5f));
  v1::UpsertRequest upsert = internal::BuildUpsertRequest("papers", std::move(documents));
  ASSERT_TRUE(upsert.documents(0).has_sparse());
  EXPECT_THAT(upsert.documents(0).sparse().indices(), ElementsAre(9, 2));
  EXPECT_THAT(upsert.documents(0).sparse().values(), ElementsAre(1.0f, 3.0f));
  EXPECT_FALSE(upsert.documents(1).has_sparse());

  SearchOptions options;
  options.sparse_query = SparseVector{{4}, {2.0f}};
  options.fusion = v1::FUSION_SCORE;
  options.sparse_weight = 0.5;
  options.fusion_candidates = 50;
  options.rerank = true;
  v1::SearchRequest request = internal::BuildSearchRequest("papers", TokenMatrix{}, options);
  EXPECT_EQ(request.query().rows(), 0u);
  EXPECT_THAT(request.sparse_query().indices(), ElementsAre(4));
  EXPECT_EQ(request.fusion(), v1::FUSION_SCORE);
  EXPECT_FALSE(request.has_dense_weight());
  EXPECT_EQ(request.sparse_weight(), 0.5);
  EXPECT_FALSE(request.has_rrf_k());
  EXPECT_EQ(request.fusion_candidates(), 50u);
  EXPECT_TRUE(request.rerank());
  EXPECT_FALSE(
      internal::BuildSearchRequest("papers", TokenMatrix{}, SearchOptions{}).has_sparse_query());

  v1::SearchResponse response;
  v1::Hit* hit = response.add_hits();
  hit->set_id("a");
  hit->set_score(0.03f);
  hit->set_sparse_score(4.5f);
  const SearchResult result = internal::DecodeSearchResponse(response);
  EXPECT_FALSE(result.hits[0].dense_score.has_value());
  EXPECT_EQ(result.hits[0].sparse_score, 4.5f);
}

TEST(Requests, EveryFilterOpHasItsProtoOp) {
  const std::vector<std::pair<FilterCondition::Op, v1::Condition::Op>> ops = {
      {FilterCondition::Op::kEq, v1::Condition::OP_EQ},
      {FilterCondition::Op::kNe, v1::Condition::OP_NE},
      {FilterCondition::Op::kLt, v1::Condition::OP_LT},
      {FilterCondition::Op::kLe, v1::Condition::OP_LE},
      {FilterCondition::Op::kGt, v1::Condition::OP_GT},
      {FilterCondition::Op::kGe, v1::Condition::OP_GE},
      {FilterCondition::Op::kIn, v1::Condition::OP_IN}};
  for (const auto& [op, proto_op] : ops) {
    Filter filter;
    filter.all_of.push_back({"f", op, {1.5}});
    EXPECT_EQ(internal::FilterToProto(filter).all_of(0).op(), proto_op);
  }
}

TEST(Responses, DecodeUpsertResponseMapsCodes) {
  v1::UpsertResponse response;
  v1::DocumentResult* ok = response.add_results();
  ok->set_id("a");
  ok->set_version(3);
  ok->set_num_vectors(5);
  v1::DocumentResult* bad = response.add_results();
  bad->set_id("b");
  bad->set_code(3);
  bad->set_message("document 'b': dim 96, collection 'papers' expects 128");
  auto results = internal::DecodeUpsertResponse(response, 2);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 2u);
  EXPECT_EQ((*results)[0].id, "a");
  EXPECT_TRUE((*results)[0].status.ok());
  EXPECT_EQ((*results)[0].version, 3u);
  EXPECT_EQ((*results)[0].num_vectors, 5u);
  EXPECT_EQ((*results)[1].status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT((*results)[1].status.message(), HasSubstr("expects 128"));

  EXPECT_EQ(internal::DecodeUpsertResponse(response, 3).status().code(),
            absl::StatusCode::kInternal);
}

TEST(Responses, DecodeGetResponseWidensFloat16Vectors) {
  v1::GetResponse response;
  response.set_id("doc");
  response.set_version(2);
  response.set_num_tokens(4);
  response.mutable_layout()->set_rows(2);
  response.mutable_layout()->set_cols(2);
  (*response.mutable_attributes())["year"].set_int_value(1999);
  (*response.mutable_attributes())["title"].set_string_value("t");
  *response.mutable_vectors() =
      TokenMatrix::Float32AsFloat16(2, 3, std::vector<float>{1, 2, 3, -1, -0.5f, 0.25f}).ToProto();
  for (uint32_t offset : {0, 3, 4}) response.add_member_offsets(offset);
  for (uint32_t member : {0, 1, 2, 3}) response.add_members(member);

  auto document = internal::DecodeGetResponse(std::move(response));
  ASSERT_TRUE(document.ok()) << document.status();
  EXPECT_EQ(document->id, "doc");
  EXPECT_EQ(document->version, 2u);
  EXPECT_EQ(document->num_tokens, 4u);
  ASSERT_TRUE(document->layout.has_value());
  EXPECT_EQ(*document->layout, (PatchLayout{2, 2, 0, 0}));
  EXPECT_EQ(document->attributes.at("year"), AttributeValue(int64_t{1999}));
  EXPECT_EQ(document->attributes.at("title"), AttributeValue(std::string("t")));
  EXPECT_EQ(document->num_vectors, 2u);
  EXPECT_EQ(document->dim, 3u);
  EXPECT_EQ(document->stored_dtype, v1::DTYPE_FLOAT16);
  EXPECT_THAT(document->vectors, ElementsAre(1, 2, 3, -1, -0.5f, 0.25f));
  EXPECT_THAT(document->member_offsets, ElementsAre(0, 3, 4));

  v1::GetResponse no_layout;
  no_layout.set_id("x");
  auto plain = internal::DecodeGetResponse(std::move(no_layout));
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->layout.has_value());
  EXPECT_EQ(plain->num_vectors, 0u);
}

TEST(Responses, DecodeSearchResponse) {
  v1::SearchResponse response;
  v1::Hit* hit = response.add_hits();
  hit->set_id("best");
  hit->set_score(12.5f);
  hit->set_version(4);
  v1::TokenMatch* match = hit->add_explanation();
  match->set_query_token(1);
  match->set_document_vector(7);
  match->set_similarity(0.9f);
  match->add_covered_tokens(14);
  match->add_covered_tokens(15);
  response.add_hits()->set_id("second");
  response.mutable_timings()->set_candidates_ms(1.5);
  response.mutable_timings()->set_fetch_ms(0.5);
  response.mutable_timings()->set_rerank_ms(2.0);
  response.mutable_timings()->set_total_ms(4.25);
  response.set_documents_scored(100);
  response.set_exhaustive(true);

  SearchResult result = internal::DecodeSearchResponse(response);
  ASSERT_EQ(result.hits.size(), 2u);
  EXPECT_EQ(result.hits[0].id, "best");
  EXPECT_EQ(result.hits[0].score, 12.5f);
  EXPECT_EQ(result.hits[0].version, 4u);
  ASSERT_EQ(result.hits[0].explanation.size(), 1u);
  EXPECT_EQ(result.hits[0].explanation[0].query_token, 1u);
  EXPECT_EQ(result.hits[0].explanation[0].document_vector, 7u);
  EXPECT_THAT(result.hits[0].explanation[0].covered_tokens, ElementsAre(14, 15));
  EXPECT_EQ(result.hits[1].id, "second");
  EXPECT_EQ(result.timings.candidates_ms, 1.5);
  EXPECT_EQ(result.timings.total_ms, 4.25);
  EXPECT_EQ(result.documents_scored, 100u);
  EXPECT_TRUE(result.exhaustive);
}

TEST(Batching, SplitsByDocumentCountAndBytesKeepingOrder) {
  std::vector<DocumentInput> documents;
  for (int i = 0; i < 10; ++i) documents.push_back(MakeDocument(absl::StrCat(i), 1, 4, 1.0f));
  UpsertOptions by_count;
  by_count.max_batch_documents = 4;
  auto batches = internal::SplitIntoBatches(documents, by_count);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[0].size(), 4u);
  EXPECT_EQ(batches[2].size(), 2u);
  EXPECT_EQ(batches[2][1].id, "9");

  // 16 bytes per document, 40 bytes per batch: two per batch; a 64-byte document goes alone.
  documents.insert(documents.begin() + 3, MakeDocument("big", 4, 4, 1.0f));
  UpsertOptions by_bytes;
  by_bytes.max_batch_bytes = 40;
  batches = internal::SplitIntoBatches(documents, by_bytes);
  std::vector<std::vector<std::string>> ids;
  for (const auto& batch : batches) {
    ids.emplace_back();
    for (const auto& document : batch) ids.back().push_back(document.id);
  }
  EXPECT_THAT(ids, ElementsAre(ElementsAre("0", "1"), ElementsAre("2"), ElementsAre("big"),
                               ElementsAre("3", "4"), ElementsAre("5", "6"), ElementsAre("7", "8"),
                               ElementsAre("9")));
  EXPECT_TRUE(internal::SplitIntoBatches({}, by_bytes).empty());
}

TEST(Connect, RejectsInconsistentOptions) {
  ClientOptions empty_address;
  empty_address.address = "";
  EXPECT_EQ(Client::Connect(empty_address).status().code(), absl::StatusCode::kInvalidArgument);

  ClientOptions cert_without_key;
  cert_without_key.tls_client_cert_file = "/nonexistent/cert.pem";
  EXPECT_EQ(Client::Connect(cert_without_key).status().code(), absl::StatusCode::kInvalidArgument);

  ClientOptions missing_root;
  missing_root.tls_root_cert_file = "/nonexistent/ca.pem";
  absl::Status status = Client::Connect(missing_root).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("/nonexistent/ca.pem"));
}

// A loopback port nothing listens on: bind one and close it again.
int UnusedPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    ADD_FAILURE() << "cannot bind a loopback port";
  }
  close(fd);
  return ntohs(address.sin_port);
}

TEST(Connect, UnreachableServerIsUnavailable) {
  ClientOptions options;
  options.address = absl::StrCat("127.0.0.1:", UnusedPort());
  options.connect_timeout = absl::Milliseconds(200);
  absl::Status status = Client::Connect(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr(options.address));

  // Connecting lazily succeeds; the first call then fails with the transport's code.
  options.connect_timeout = absl::ZeroDuration();
  options.timeout = absl::Seconds(2);
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->ListCollections().status().code(), absl::StatusCode::kUnavailable);
}

// A fake IngestService that acknowledges each batch (version = running count) and rejects
// documents whose id starts with "bad", recording the metadata it saw.
class FakeIngest final : public v1::IngestService::Service {
 public:
  grpc::Status Upsert(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::UpsertResponse, v1::UpsertRequest>* stream) override {
    RecordMetadata(context);
    v1::UpsertRequest request;
    while (stream->Read(&request)) {
      v1::UpsertResponse response;
      {
        absl::MutexLock lock(&mu_);
        batch_sizes_.push_back(request.documents_size());
        if (request.collection() == "closing" && batch_sizes_.size() == 2) {
          return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "too many batches");
        }
      }
      for (const v1::Document& document : request.documents()) {
        v1::DocumentResult* result = response.add_results();
        result->set_id(document.id());
        if (document.id().rfind("bad", 0) == 0) {
          result->set_code(grpc::StatusCode::INVALID_ARGUMENT);
          result->set_message(absl::StrCat("document '", document.id(), "' is bad"));
        } else {
          result->set_version(++stored_);
          result->set_num_vectors(document.tokens().rows());
        }
      }
      if (!stream->Write(response)) break;
    }
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext* context, const v1::GetRequest* request,
                   v1::GetResponse* response) override {
    RecordMetadata(context);
    if (request->id() != "known") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("document '", request->id(), "' not found"));
    }
    response->set_id(request->id());
    response->set_num_tokens(2);
    *response->mutable_vectors() =
        TokenMatrix::FromFloat32(1, 2, std::vector<float>{0.5f, 0.25f}).ToProto();
    return grpc::Status::OK;
  }

  std::vector<int> batch_sizes() {
    absl::MutexLock lock(&mu_);
    return batch_sizes_;
  }
  std::string authorization() {
    absl::MutexLock lock(&mu_);
    return authorization_;
  }
  bool had_deadline() {
    absl::MutexLock lock(&mu_);
    return had_deadline_;
  }

 private:
  void RecordMetadata(grpc::ServerContext* context) {
    absl::MutexLock lock(&mu_);
    auto it = context->client_metadata().find("authorization");
    authorization_ = it == context->client_metadata().end()
                         ? ""
                         : std::string(it->second.data(), it->second.size());
    had_deadline_ = context->deadline() != std::chrono::system_clock::time_point::max();
  }

  absl::Mutex mu_;
  std::vector<int> batch_sizes_ ABSL_GUARDED_BY(mu_);
  std::string authorization_ ABSL_GUARDED_BY(mu_);
  bool had_deadline_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t stored_ = 0;  // only the stream's thread touches it
};

class FakeServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ClientOptions options;
    options.address = absl::StrCat("127.0.0.1:", port);
    options.api_key = "secret-key";
    options.timeout = absl::Seconds(20);
    auto client = Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }
  void TearDown() override {
    client_.reset();
    if (server_) server_->Shutdown();
  }

  FakeIngest service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(FakeServerTest, UpsertSendsOneRequestPerBatchAndKeepsOrder) {
  std::vector<DocumentInput> documents;
  for (int i = 0; i < 10; ++i) {
    documents.push_back(MakeDocument(i == 6 ? "bad6" : absl::StrCat("d", i), 3, 4, 0.5f));
  }
  UpsertOptions options;
  options.max_batch_documents = 3;
  options.max_in_flight = 2;
  auto results = client_->Upsert("papers", std::move(documents), options);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 10u);
  for (int i = 0; i < 10; ++i) {
    if (i == 6) {
      EXPECT_EQ((*results)[i].id, "bad6");
      EXPECT_EQ((*results)[i].status.code(), absl::StatusCode::kInvalidArgument);
    } else {
      EXPECT_EQ((*results)[i].id, absl::StrCat("d", i));
      EXPECT_TRUE((*results)[i].status.ok()) << (*results)[i].status;
      EXPECT_EQ((*results)[i].num_vectors, 3u);
    }
  }
  EXPECT_THAT(service_.batch_sizes(), ElementsAre(3, 3, 3, 1));
  EXPECT_EQ(service_.authorization(), "Bearer secret-key");
  EXPECT_TRUE(service_.had_deadline());
}

TEST_F(FakeServerTest, UpsertReportsTheStatusOfAStreamTheServerCloses) {
  std::vector<DocumentInput> documents;
  for (int i = 0; i < 6; ++i) documents.push_back(MakeDocument(absl::StrCat(i), 1, 4, 1.0f));
  UpsertOptions options;
  options.max_batch_documents = 2;
  options.max_in_flight = 1;
  absl::Status status = client_->Upsert("closing", std::move(documents), options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(), "too many batches");
}

TEST_F(FakeServerTest, UpsertStreamPipelinesBatches) {
  auto stream = client_->OpenUpsertStream("papers");
  ASSERT_TRUE(stream.ok()) << stream.status();
  for (int batch = 0; batch < 3; ++batch) {
    std::vector<DocumentInput> documents;
    documents.push_back(MakeDocument(absl::StrCat("b", batch, "-0"), 2, 4, 1.0f));
    documents.push_back(MakeDocument(absl::StrCat("b", batch, "-1"), 2, 4, 1.0f));
    ASSERT_TRUE((*stream)->Write(std::move(documents)).ok());
  }
  for (int batch = 0; batch < 3; ++batch) {
    auto results = (*stream)->Read();
    ASSERT_TRUE(results.ok()) << results.status();
    ASSERT_EQ(results->size(), 2u);
    EXPECT_EQ((*results)[1].id, absl::StrCat("b", batch, "-1"));
  }
  EXPECT_TRUE((*stream)->Finish().ok());
  EXPECT_TRUE((*stream)->Finish().ok());  // idempotent
  EXPECT_EQ((*stream)->Read().status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*stream)->Write({}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(service_.had_deadline());  // streams have no deadline unless asked
}

TEST_F(FakeServerTest, UpsertStreamRejectsMalformedMatricesBeforeSending) {
  auto stream = client_->OpenUpsertStream("papers");
  ASSERT_TRUE(stream.ok());
  std::vector<DocumentInput> documents(1);
  documents[0].id = "broken";
  documents[0].tokens = TokenMatrix::FromPackedBytes(2, 2, v1::DTYPE_FLOAT32, "abc");
  absl::Status status = (*stream)->Write(std::move(documents));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("document 'broken'"));
  EXPECT_TRUE((*stream)->Finish().ok());
  EXPECT_TRUE(service_.batch_sizes().empty());
}

TEST_F(FakeServerTest, GetDecodesAndErrorsKeepTheirCode) {
  auto document = client_->Get("papers", "known");
  ASSERT_TRUE(document.ok()) << document.status();
  EXPECT_THAT(document->vectors, ElementsAre(0.5f, 0.25f));
  absl::Status missing = client_->Get("papers", "other").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.message(), "document 'other' not found");
  // A service the fake does not implement answers UNIMPLEMENTED.
  EXPECT_EQ(client_->ListCollections().status().code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace tessera::client
