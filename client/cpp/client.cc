// tessera::client::Client: request building, matrix packing and the gRPC calls.
#include "client/cpp/client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tessera/status_macros.h"
#include "tessera/wire/attribute.h"
#include "tessera/wire/matrix.h"
#include "tessera/wire/status.h"

namespace tessera::client {
namespace {

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", what, " '", path, "'"));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", what, " '", path, "'"));
  return contents.str();
}

v1::PatchGrid LayoutToProto(const PatchLayout& layout) {
  v1::PatchGrid grid;
  grid.set_rows(layout.rows);
  grid.set_cols(layout.cols);
  grid.set_prefix_tokens(layout.prefix_tokens);
  grid.set_suffix_tokens(layout.suffix_tokens);
  return grid;
}

PatchLayout LayoutFromProto(const v1::PatchGrid& grid) {
  return PatchLayout{grid.rows(), grid.cols(), grid.prefix_tokens(), grid.suffix_tokens()};
}

v1::Condition::Op OpToProto(FilterCondition::Op op) {
  switch (op) {
    case FilterCondition::Op::kEq:
      return v1::Condition::OP_EQ;
    case FilterCondition::Op::kNe:
      return v1::Condition::OP_NE;
    case FilterCondition::Op::kLt:
      return v1::Condition::OP_LT;
    case FilterCondition::Op::kLe:
      return v1::Condition::OP_LE;
    case FilterCondition::Op::kGt:
      return v1::Condition::OP_GT;
    case FilterCondition::Op::kGe:
      return v1::Condition::OP_GE;
    case FilterCondition::Op::kIn:
      return v1::Condition::OP_IN;
    case FilterCondition::Op::kExists:
      return v1::Condition::OP_EXISTS;
    case FilterCondition::Op::kMissing:
      return v1::Condition::OP_MISSING;
    case FilterCondition::Op::kPrefix:
      return v1::Condition::OP_PREFIX;
  }
  return v1::Condition::OP_UNSPECIFIED;
}

std::chrono::system_clock::time_point DeadlineAfter(absl::Duration timeout) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             absl::ToChronoNanoseconds(timeout));
}

}  // namespace

// ---- TokenMatrix ----

TokenMatrix TokenMatrix::FromFloat32(uint32_t rows, uint32_t cols, absl::Span<const float> values) {
  std::string data;
  wire::PackFloat32(values.data(), values.size(), v1::DTYPE_FLOAT32, &data);
  return FromPackedBytes(rows, cols, v1::DTYPE_FLOAT32, std::move(data));
}

TokenMatrix TokenMatrix::FromFloat16(uint32_t rows, uint32_t cols,
                                     absl::Span<const Float16> values) {
  std::string data;
  wire::PackFloat16(values.data(), values.size(), &data);
  return FromPackedBytes(rows, cols, v1::DTYPE_FLOAT16, std::move(data));
}

TokenMatrix TokenMatrix::Float32AsFloat16(uint32_t rows, uint32_t cols,
                                          absl::Span<const float> values) {
  std::string data;
  wire::PackFloat32(values.data(), values.size(), v1::DTYPE_FLOAT16, &data);
  return FromPackedBytes(rows, cols, v1::DTYPE_FLOAT16, std::move(data));
}

TokenMatrix TokenMatrix::FromPackedBytes(uint32_t rows, uint32_t cols, v1::DType dtype,
                                         std::string data) {
  TokenMatrix matrix;
  matrix.rows = rows;
  matrix.cols = cols;
  matrix.dtype = dtype;
  matrix.data = std::move(data);
  return matrix;
}

absl::Status TokenMatrix::Validate() const {
  return wire::CheckMatrix(rows, cols, dtype, data.size(), 0, "matrix");
}

absl::StatusOr<std::vector<float>> TokenMatrix::ToFloat32() const {
  TESSERA_RETURN_IF_ERROR(Validate());
  std::vector<float> values(static_cast<size_t>(rows) * cols);
  wire::UnpackToFloat32(data.data(), values.size(), dtype, values.data());
  return values;
}

v1::Matrix TokenMatrix::ToProto() const& {
  v1::Matrix matrix;
  matrix.set_rows(rows);
  matrix.set_cols(cols);
  matrix.set_dtype(dtype);
  matrix.set_data(data);
  return matrix;
}

v1::Matrix TokenMatrix::ToProto() && {
  v1::Matrix matrix;
  matrix.set_rows(rows);
  matrix.set_cols(cols);
  matrix.set_dtype(dtype);
  matrix.set_data(std::move(data));
  return matrix;
}

absl::StatusOr<TokenMatrix> TokenMatrix::FromProto(v1::Matrix&& matrix) {
  TokenMatrix result = FromPackedBytes(matrix.rows(), matrix.cols(), matrix.dtype(),
                                       std::move(*matrix.mutable_data()));
  TESSERA_RETURN_IF_ERROR(result.Validate());
  return result;
}

// ---- Request building and response decoding ----

namespace internal {

v1::Filter FilterToProto(const Filter& filter) {
  v1::Filter proto;
  for (const FilterCondition& condition : filter.all_of) {
    v1::Condition* out = proto.add_all_of();
    out->set_field(condition.field);
    out->set_op(OpToProto(condition.op));
    for (const AttributeValue& value : condition.values) {
      wire::AttributeToProto(value, out->add_values());
    }
  }
  for (const Filter& alternative : filter.any_of) *proto.add_any_of() = FilterToProto(alternative);
  for (const Filter& alternative : filter.none_of) {
    *proto.add_none_of() = FilterToProto(alternative);
  }
  return proto;
}

v1::UpsertRequest BuildUpsertRequest(const std::string& collection,
                                     std::vector<DocumentInput> documents) {
  v1::UpsertRequest request;
  request.set_collection(collection);
  request.mutable_documents()->Reserve(static_cast<int>(documents.size()));
  for (DocumentInput& input : documents) {
    v1::Document* document = request.add_documents();
    document->set_id(std::move(input.id));
    *document->mutable_tokens() = std::move(input.tokens).ToProto();
    if (input.layout.has_value()) *document->mutable_layout() = LayoutToProto(*input.layout);
    if (input.sparse.has_value()) {
      document->mutable_sparse()->mutable_indices()->Add(input.sparse->indices.begin(),
                                                         input.sparse->indices.end());
      document->mutable_sparse()->mutable_values()->Add(input.sparse->values.begin(),
                                                        input.sparse->values.end());
    }
    auto& attributes = *document->mutable_attributes();
    for (const auto& [name, value] : input.attributes)
      wire::AttributeToProto(value, &attributes[name]);
  }
  return request;
}

v1::SearchRequest BuildSearchRequest(const std::string& collection, const TokenMatrix& query,
                                     const SearchOptions& options) {
  v1::SearchRequest request;
  request.set_collection(collection);
  *request.mutable_query() = query.ToProto();
  request.set_k(options.k);
  request.set_num_candidates(options.num_candidates);
  request.set_per_token_candidates(options.per_token_candidates);
  request.set_nprobe(options.nprobe);
  if (!options.filter.empty()) *request.mutable_filter() = FilterToProto(options.filter);
  request.set_exhaustive(options.exhaustive);
  request.set_explain(options.explain);
  request.set_allow_partial_results(options.allow_partial_results);
  request.set_with_attributes(options.with_attributes);
  for (const std::string& field : options.attribute_fields) request.add_attribute_fields(field);
  request.set_group_by(options.group_by);
  if (!options.group_by.empty()) {
    request.set_group_size(options.group_size);
    request.set_groups(options.groups);
  }
  if (options.sparse_query.has_value()) {
    v1::SparseVector* sparse = request.mutable_sparse_query();
    sparse->mutable_indices()->Add(options.sparse_query->indices.begin(),
                                   options.sparse_query->indices.end());
    sparse->mutable_values()->Add(options.sparse_query->values.begin(),
                                  options.sparse_query->values.end());
    request.set_fusion(options.fusion);
    if (options.dense_weight.has_value()) request.set_dense_weight(*options.dense_weight);
    if (options.sparse_weight.has_value()) request.set_sparse_weight(*options.sparse_weight);
    if (options.rrf_k.has_value()) request.set_rrf_k(*options.rrf_k);
    request.set_fusion_candidates(options.fusion_candidates);
    request.set_rerank(options.rerank);
  }
  return request;
}

absl::StatusOr<std::vector<DocumentResult>> DecodeUpsertResponse(const v1::UpsertResponse& response,
                                                                 size_t expected_results) {
  if (static_cast<size_t>(response.results_size()) != expected_results) {
    return absl::InternalError(absl::StrCat("the server answered an upsert batch of ",
                                            expected_results, " documents with ",
                                            response.results_size(), " results"));
  }
  std::vector<DocumentResult> results;
  results.reserve(expected_results);
  for (const v1::DocumentResult& proto : response.results()) {
    DocumentResult result;
    result.id = proto.id();
    if (proto.code() != 0) {
      result.status = absl::Status(static_cast<absl::StatusCode>(proto.code()), proto.message());
      if (result.status.ok()) result.status = absl::UnknownError(proto.message());
    }
    result.version = proto.version();
    result.num_vectors = proto.num_vectors();
    results.push_back(std::move(result));
  }
  return results;
}

absl::StatusOr<StoredDocument> DecodeGetResponse(v1::GetResponse&& response) {
  StoredDocument document;
  document.id = response.id();
  document.version = response.version();
  document.num_tokens = response.num_tokens();
  if (response.has_layout()) document.layout = LayoutFromProto(response.layout());
  for (const auto& [name, value] : response.attributes()) {
    TESSERA_ASSIGN_OR_RETURN(AttributeValue decoded, wire::AttributeFromProto(value));
    document.attributes.emplace(name, std::move(decoded));
  }
  if (response.has_vectors()) {
    TESSERA_ASSIGN_OR_RETURN(TokenMatrix vectors,
                             TokenMatrix::FromProto(std::move(*response.mutable_vectors())));
    document.num_vectors = vectors.rows;
    document.dim = vectors.cols;
    document.stored_dtype = vectors.dtype;
    TESSERA_ASSIGN_OR_RETURN(document.vectors, vectors.ToFloat32());
  }
  document.member_offsets.assign(response.member_offsets().begin(),
                                 response.member_offsets().end());
  document.members.assign(response.members().begin(), response.members().end());
  if (response.has_sparse()) {
    document.sparse =
        SparseVector{{response.sparse().indices().begin(), response.sparse().indices().end()},
                     {response.sparse().values().begin(), response.sparse().values().end()}};
  }
  return document;
}

// Attributes off the wire; a value with none set (which no server sends) is left out.
Attributes DecodeAttributes(const google::protobuf::Map<std::string, v1::AttributeValue>& map) {
  Attributes attributes;
  for (const auto& [name, value] : map) {
    absl::StatusOr<AttributeValue> decoded = wire::AttributeFromProto(value);
    if (decoded.ok()) attributes.emplace(name, *std::move(decoded));
  }
  return attributes;
}

SearchHit DecodeHit(const v1::Hit& proto) {
  SearchHit hit;
  hit.id = proto.id();
  hit.score = proto.score();
  hit.version = proto.version();
  for (const v1::TokenMatch& match : proto.explanation()) {
    hit.explanation.push_back(TokenMatch{
        match.query_token(), match.document_vector(), match.similarity(),
        std::vector<uint32_t>(match.covered_tokens().begin(), match.covered_tokens().end())});
  }
  hit.attributes = DecodeAttributes(proto.attributes());
  if (proto.has_dense_score()) hit.dense_score = proto.dense_score();
  if (proto.has_sparse_score()) hit.sparse_score = proto.sparse_score();
  return hit;
}

SearchResult DecodeSearchResponse(const v1::SearchResponse& response) {
  SearchResult result;
  result.hits.reserve(response.hits_size());
  for (const v1::Hit& proto : response.hits()) result.hits.push_back(DecodeHit(proto));
  for (const v1::HitGroup& proto : response.groups()) {
    SearchGroup group;
    absl::StatusOr<AttributeValue> value = wire::AttributeFromProto(proto.value());
    if (value.ok()) group.value = *std::move(value);
    for (const v1::Hit& hit : proto.hits()) group.hits.push_back(DecodeHit(hit));
    result.groups.push_back(std::move(group));
  }
  result.timings.candidates_ms = response.timings().candidates_ms();
  result.timings.fetch_ms = response.timings().fetch_ms();
  result.timings.rerank_ms = response.timings().rerank_ms();
  result.timings.total_ms = response.timings().total_ms();
  result.timings.fanout_ms = response.timings().fanout_ms();
  result.documents_scored = response.documents_scored();
  result.exhaustive = response.exhaustive();
  result.missing_shards.assign(response.missing_shards().begin(), response.missing_shards().end());
  return result;
}

std::vector<std::vector<DocumentInput>> SplitIntoBatches(std::vector<DocumentInput> documents,
                                                         const UpsertOptions& options) {
  const size_t max_documents = std::max<size_t>(options.max_batch_documents, 1);
  std::vector<std::vector<DocumentInput>> batches;
  size_t batch_bytes = 0;
  for (DocumentInput& document : documents) {
    const size_t bytes = document.tokens.data.size();
    if (batches.empty() || batches.back().size() >= max_documents ||
        (!batches.back().empty() && batch_bytes + bytes > options.max_batch_bytes)) {
      batches.emplace_back();
      batch_bytes = 0;
    }
    batch_bytes += bytes;
    batches.back().push_back(std::move(document));
  }
  return batches;
}

}  // namespace internal

// ---- UpsertStream ----

UpsertStream::UpsertStream(std::string collection, std::unique_ptr<grpc::ClientContext> context,
                           v1::IngestService::Stub* stub)
    : collection_(std::move(collection)), context_(std::move(context)) {
  stream_ = stub->Upsert(context_.get());
}

UpsertStream::~UpsertStream() {
  if (!finished_) {
    context_->TryCancel();
    FinishCall().IgnoreError();
  }
}

absl::Status UpsertStream::Write(std::vector<DocumentInput> documents) {
  if (finished_ || writes_done_) {
    return absl::FailedPreconditionError("Write on an upsert stream after Finish");
  }
  for (const DocumentInput& document : documents) {
    absl::Status valid = document.tokens.Validate();
    if (!valid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("document '", document.id, "': ", valid.message()));
    }
  }
  const size_t count = documents.size();
  v1::UpsertRequest request = internal::BuildUpsertRequest(collection_, std::move(documents));
  if (!stream_->Write(request)) {
    return absl::AbortedError(
        "the upsert stream is closed; Read returns the pending results and then the reason");
  }
  pending_sizes_.push_back(count);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<DocumentResult>> UpsertStream::Read() {
  if (!finished_) {
    v1::UpsertResponse response;
    if (stream_->Read(&response)) {
      if (pending_sizes_.empty()) {
        return absl::InternalError("the server sent an upsert response for no batch");
      }
      const size_t expected = pending_sizes_.front();
      pending_sizes_.pop_front();
      return internal::DecodeUpsertResponse(response, expected);
    }
    FinishCall().IgnoreError();
  }
  if (!final_status_.ok()) return final_status_;
  if (!pending_sizes_.empty()) {
    return absl::InternalError(absl::StrCat("the upsert stream ended with ", pending_sizes_.size(),
                                            " batches unacknowledged"));
  }
  return absl::OutOfRangeError("the upsert stream has no more responses");
}

absl::Status UpsertStream::Finish() { return FinishCall(); }

void UpsertStream::Cancel() { context_->TryCancel(); }

absl::Status UpsertStream::FinishCall() {
  if (finished_) return final_status_;
  if (!writes_done_) {
    stream_->WritesDone();
    writes_done_ = true;
  }
  // Drain responses nobody read, so that Finish does not wait on them.
  v1::UpsertResponse discarded;
  while (stream_->Read(&discarded)) {
  }
  final_status_ = wire::FromGrpcStatus(stream_->Finish());
  finished_ = true;
  return final_status_;
}

// ---- Client ----

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.address.empty()) return absl::InvalidArgumentError("the server address is empty");
  if (options.tls_client_cert_file.empty() != options.tls_client_key_file.empty()) {
    return absl::InvalidArgumentError(
        "a TLS client certificate and its key go together: give both files or neither");
  }
  const bool tls = options.use_tls || !options.tls_root_cert_file.empty() ||
                   !options.tls_client_cert_file.empty();
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (tls) {
    grpc::SslCredentialsOptions ssl;
    if (!options.tls_root_cert_file.empty()) {
      TESSERA_ASSIGN_OR_RETURN(ssl.pem_root_certs,
                               ReadWholeFile(options.tls_root_cert_file, "TLS root certificate"));
    }
    if (!options.tls_client_cert_file.empty()) {
      TESSERA_ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadWholeFile(options.tls_client_cert_file,
                                                                 "TLS client certificate"));
      TESSERA_ASSIGN_OR_RETURN(ssl.pem_private_key,
                               ReadWholeFile(options.tls_client_key_file, "TLS client key"));
    }
    credentials = grpc::SslCredentials(ssl);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(options.max_message_bytes);
  arguments.SetMaxSendMessageSize(options.max_message_bytes);
  if (tls && !options.tls_server_name.empty()) {
    arguments.SetSslTargetNameOverride(options.tls_server_name);
  }
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options.address, credentials, arguments);
  if (channel == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create a channel to '", options.address, "'"));
  }
  if (options.connect_timeout > absl::ZeroDuration()) {
    if (!channel->WaitForConnected(DeadlineAfter(options.connect_timeout))) {
      return absl::UnavailableError(absl::StrCat("cannot connect to ", options.address, " within ",
                                                 absl::FormatDuration(options.connect_timeout)));
    }
  }
  return std::unique_ptr<Client>(new Client(options, std::move(channel)));
}

Client::Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      admin_(v1::AdminService::NewStub(channel_)),
      ingest_(v1::IngestService::NewStub(channel_)),
      query_(v1::QueryService::NewStub(channel_)) {}

std::unique_ptr<grpc::ClientContext> Client::MakeContext(absl::Duration timeout) const {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!options_.api_key.empty()) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", options_.api_key));
  }
  if (timeout != absl::InfiniteDuration()) context->set_deadline(DeadlineAfter(timeout));
  return context;
}

absl::StatusOr<v1::CollectionSchema> Client::CreateCollection(const v1::CollectionSchema& schema,
                                                              uint32_t replicas) {
  v1::CreateCollectionRequest request;
  *request.mutable_schema() = schema;
  request.set_replicas(replicas);
  v1::CreateCollectionResponse response;
  auto context = MakeContext(options_.timeout);
  TESSERA_RETURN_IF_ERROR(
      wire::FromGrpcStatus(admin_->CreateCollection(context.get(), request, &response)));
  return std::move(*response.mutable_schema());
}

absl::Status Client::DropCollection(const std::string& name) {
  v1::DropCollectionRequest request;
  request.set_name(name);
  v1::DropCollectionResponse response;
  auto context = MakeContext(options_.timeout);
  return wire::FromGrpcStatus(admin_->DropCollection(context.get(), request, &response));
}

absl::StatusOr<std::vector<std::string>> Client::ListCollections() {
  v1::ListCollectionsRequest request;
  v1::ListCollectionsResponse response;
  auto context = MakeContext(options_.timeout);
  TESSERA_RETURN_IF_ERROR(
      wire::FromGrpcStatus(admin_->ListCollections(context.get(), request, &response)));
  return std::vector<std::string>(response.names().begin(), response.names().end());
}

absl::StatusOr<CollectionInfo> Client::GetCollection(const std::string& name) {
  v1::GetCollectionRequest request;
  request.set_name(name);
  v1::GetCollectionResponse response;
  auto context = MakeContext(options_.timeout);
  TESSERA_RETURN_IF_ERROR(
      wire::FromGrpcStatus(admin_->GetCollection(context.get(), request, &response)));
  CollectionInfo info;
  info.schema = std::move(*response.mutable_schema());
  info.stats = std::move(*response.mutable_stats());
  info.shards.assign(response.shards().begin(), response.shards().end());
  return info;
}

absl::Status Client::Flush(const std::string& name) {
  v1::FlushRequest request;
  request.set_name(name);
  v1::FlushResponse response;
  auto context = MakeContext(options_.timeout);
  return wire::FromGrpcStatus(admin_->Flush(context.get(), request, &response));
}

absl::StatusOr<v1::SnapshotInfo> Client::CreateSnapshot(const std::string& collection) {
  v1::CreateSnapshotRequest request;
  request.set_collection(collection);
  v1::CreateSnapshotResponse response;
  auto context = MakeContext(options_.timeout);
  TESSERA_RETURN_IF_ERROR(
      wire::FromGrpcStatus(admin_->CreateSnapshot(context.get(), request, &response)));
  return response.snapshot();
}

absl::StatusOr<std::vector<v1::SnapshotInfo>> Client::ListSnapshots(const std::string& collection) {
  v1::ListSnapshotsRequest request;
  request.set_collection(collection);
  v1::ListSnapshotsResponse response;
  auto context = MakeContext(options_.timeout);
  TESSERA_RETURN_IF_ERROR(
      wire::FromGrpcStatus(admin_->ListSnapshots(context.get(), request, &response)));
  return std::vector<v1::SnapshotInfo>(response.snapshots().begin(), response.snapshots().end());
}

absl::Status Client::DeleteSnapshot(const std::string& id) {
  v1::DeleteSnapshotRequest request;
  request.set_id(id);
  v1::DeleteSnapshotResponse response;
  auto context = MakeContext(options_.timeout);
  return wire::FromGrpcStatus(admin_->DeleteSnapshot(context.get(), request, &response));
}

absl::Status Client::DownloadSnapshot(const std::string& id,
                                      const std::function<absl::Status(absl::string_view)>& sink) {
  v1::DownloadSnapshotRequest request;
  request.set_id(id);
  auto context = MakeContext(absl::InfiniteDuration());
  std::unique_ptr<grpc::ClientReader<v1::SnapshotChunk>> reader =
      admin_->DownloadSnapshot(context.get(), request);
  v1::SnapshotChunk chunk;
  absl::Status written;
  while (written.ok() && reader->Read(&chunk)) written = sink(chunk.data());
  if (!written.ok()) {
    context->TryCancel();
    reader->Finish().ok();
    return written;
  }
  return wire::FromGrpcStatus(reader->Finish());
}

absl::Status Client::DownloadSnapshotToFile(const std::string& id, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::NotFoundError(absl::StrCat("cannot write ", path));
  absl::Status status = DownloadSnapshot(id, [&out, &path](absl::string_view bytes) {
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return out ? absl::OkStatus() : absl::InternalError(absl::StrCat("cannot write ", path));
  });
  out.close();
  if (status.ok() && !out) status = absl::InternalError(absl::StrCat("cannot write ", path));
  if (!status.ok()) std::remove(path.c_str());
  return status;
}

absl::StatusOr<v1::SnapshotInfo> Client::RestoreSnapshot(const std::string& id,
                                                         const std::string& new_collection) {
  v1::RestoreSnapshotRequest request;
  request.set_new_collection(new_collection);
  request.set_snapshot_id(id);
  v1::RestoreSnapshotResponse response;
  auto context = MakeContext(absl::InfiniteDuration());
  std::unique_ptr<grpc::ClientWriter<v1::RestoreSnapshotRequest>> writer =
      admin_->RestoreSnapshot(context.get(), &response);
  writer->Write(request);
  writer->WritesDone();
  TESSERA_RETURN_IF_ERROR(wire::FromGrpcStatus(writer->Finish()));
  return response.snapshot();
}

absl::StatusOr<v1::SnapshotInfo> Client::RestoreSnapshotFromFile(
    const std::string& path, const std::string& new_collection) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  v1::RestoreSnapshotResponse response;
  auto context = MakeContext(absl::InfiniteDuration());
  std::unique_ptr<grpc::ClientWriter<v1::RestoreSnapshotRequest>> writer =
      admin_->RestoreSnapshot(context.get(), &response);
  std::vector<char> buffer(size_t{1} << 20);
  bool first = true;
  while (true) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto n = static_cast<size_t>(in.gcount());
    if (n == 0 && !first) break;
    v1::RestoreSnapshotRequest request;
    if (first) request.set_new_collection(new_collection);
    first = false;
    request.set_data(buffer.data(), n);
    // A refused stream ends early: Finish says why.
    if (!writer->Write(request)) break;
    if (n < buffer.size()) break;
  }
  writer->WritesDone();
  TESSERA_RETURN_IF_ERROR(wire::FromGrpcStatus(writer->Finish()));
  return response.snapshot();
}

absl::StatusOr<std::unique_ptr<UpsertStream>> Client::OpenUpsertStream(
    const std::string& collection, absl::Duration timeout) {
  return std::unique_ptr<UpsertStream>(
      new UpsertStream(collection, MakeContext(timeout), ingest_.get()));
}

absl::StatusOr<std::vector<DocumentResult>> Client::Upsert(const std::string& collection,
                                                           std::vector<DocumentInput> documents,
                                                           const UpsertOptions& options) {
  for (const DocumentInput& document : documents) {
    absl::Status valid = document.tokens.Validate();
    if (!valid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("document '", document.id, "': ", valid.message()));
    }
  }
  std::vector<std::vector<DocumentInput>> batches =
      internal::SplitIntoBatches(std::move(documents), options);
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<UpsertStream> stream,
                           OpenUpsertStream(collection, options_.timeout));
  const size_t window = std::max<size_t>(options.max_in_flight, 1);
  std::vector<DocumentResult> results;
  size_t written = 0;
  size_t read = 0;
  bool closed = false;
  while (read < written || (!closed && written < batches.size())) {
    if (!closed && written < batches.size() && written - read < window) {
      absl::Status status = stream->Write(std::move(batches[written]));
      if (status.ok()) {
        ++written;
        continue;
      }
      if (!absl::IsAborted(status)) return status;
      closed = true;  // Collect what was acknowledged; Read then reports why.
      continue;
    }
    TESSERA_ASSIGN_OR_RETURN(std::vector<DocumentResult> batch_results, stream->Read());
    for (DocumentResult& result : batch_results) results.push_back(std::move(result));
    ++read;
  }
  absl::Status status = stream->Finish();
  if (!status.ok()) return status;
  if (closed) {
    return absl::UnavailableError(absl::StrCat("the server closed the upsert stream after ", read,
                                               " of ", batches.size(), " batches"));
  }
  return results;
}

absl::StatusOr<std::vector<bool>> Client::Delete(const std::string& collection,
                                                 const std::vector<std::string>& ids) {
  v1::DeleteRequest request;
  request.set_collection(collection);
  for (const std::string& id : ids) request.add_ids(id);
  v1::DeleteResponse response;
  auto context = MakeContext(options_.timeout);
  TESSERA_RETURN_IF_ERROR(wire::FromGrpcStatus(ingest_->Delete(context.get(), request, &response)));
  if (static_cast<size_t>(response.existed_size()) != ids.size()) {
    return absl::InternalError(absl::StrCat("the server answered a delete of ", ids.size(),
                                            " ids with ", response.existed_size(), " flags"));
  }
  return std::vector<bool>(response.existed().begin(), response.existed().end());
}

absl::StatusOr<uint64_t> Client::DeleteMatching(const std::string& collection,
                                                const Filter& filter) {
  v1::DeleteRequest request;
  request.set_collection(collection);
  *request.mutable_filter() = internal::FilterToProto(filter);
  v1::DeleteResponse response;
  auto context = MakeContext(options_.timeout);
  TESSERA_RETURN_IF_ERROR(wire::FromGrpcStatus(ingest_->Delete(context.get(), request, &response)));
  return response.deleted();
}

absl::StatusOr<uint64_t> Client::Count(const std::string& collection, const Filter& filter) {
  v1::CountRequest request;
  request.set_collection(collection);
  *request.mutable_filter() = internal::FilterToProto(filter);
  v1::CountResponse response;
  auto context = MakeContext(options_.timeout);
  TESSERA_RETURN_IF_ERROR(wire::FromGrpcStatus(query_->Count(context.get(), request, &response)));
  return response.count();
}

absl::StatusOr<ScrollPage> Client::Scroll(const std::string& collection,
                                          const ScrollOptions& options) {
  v1::ScrollRequest request;
  request.set_collection(collection);
  *request.mutable_filter() = internal::FilterToProto(options.filter);
  request.set_after(options.after);
  request.set_limit(options.limit);
  request.set_with_attributes(options.with_attributes);
  for (const std::string& field : options.attribute_fields) request.add_attribute_fields(field);
  v1::ScrollResponse response;
  auto context = MakeContext(options_.timeout);
  TESSERA_RETURN_IF_ERROR(wire::FromGrpcStatus(query_->Scroll(context.get(), request, &response)));
  ScrollPage page;
  for (const v1::ScrolledDocument& proto : response.documents()) {
    page.documents.push_back(ScrolledDocument{proto.id(), proto.version(),
                                              internal::DecodeAttributes(proto.attributes())});
  }
  page.next_after = response.next_after();
  return page;
}

absl::StatusOr<StoredDocument> Client::Get(const std::string& collection, const std::string& id) {
  v1::GetRequest request;
  request.set_collection(collection);
  request.set_id(id);
  v1::GetResponse response;
  auto context = MakeContext(options_.timeout);
  TESSERA_RETURN_IF_ERROR(wire::FromGrpcStatus(ingest_->Get(context.get(), request, &response)));
  return internal::DecodeGetResponse(std::move(response));
}

absl::StatusOr<SearchResult> Client::Search(const std::string& collection, const TokenMatrix& query,
                                            const SearchOptions& options) {
  TESSERA_RETURN_IF_ERROR(query.Validate());
  v1::SearchRequest request = internal::BuildSearchRequest(collection, query, options);
  v1::SearchResponse response;
  auto context = MakeContext(options_.timeout);
  TESSERA_RETURN_IF_ERROR(wire::FromGrpcStatus(query_->Search(context.get(), request, &response)));
  return internal::DecodeSearchResponse(response);
}

absl::StatusOr<std::vector<SearchResult>> Client::SearchBatch(
    const std::vector<SearchQuery>& queries) {
  v1::SearchBatchRequest request;
  for (const SearchQuery& query : queries) {
    TESSERA_RETURN_IF_ERROR(query.query.Validate());
    *request.add_searches() =
        internal::BuildSearchRequest(query.collection, query.query, query.options);
  }
  v1::SearchBatchResponse response;
  auto context = MakeContext(options_.timeout);
  TESSERA_RETURN_IF_ERROR(
      wire::FromGrpcStatus(query_->SearchBatch(context.get(), request, &response)));
  if (static_cast<size_t>(response.responses_size()) != queries.size()) {
    return absl::InternalError(absl::StrCat("the server answered ", queries.size(),
                                            " searches with ", response.responses_size(),
                                            " responses"));
  }
  std::vector<SearchResult> results;
  results.reserve(queries.size());
  for (const v1::SearchResponse& one : response.responses()) {
    results.push_back(internal::DecodeSearchResponse(one));
  }
  return results;
}

}  // namespace tessera::client
