// The C++ client of a Tessera server: one `Client` per server address, with a method for every RPC
// of the public services (tessera.v1 AdminService, IngestService, QueryService) that takes and
// returns C++ types. Token matrices travel packed (little-endian fp32 or fp16 bytes, never repeated
// floats); `TokenMatrix` holds them in that form so that a large ingest is encoded once.
//
// Namespace tessera::client: the index library (tessera/collection.h) has types of the same names
// (SearchOptions, SearchResult, …) with other fields, and a program may use both.
//
// Every call returns absl::Status/StatusOr: a gRPC status becomes the absl status with the same
// code and message (the two code sets are the same numbers). Unary calls carry the per-call
// deadline of ClientOptions; streams opened with OpenUpsertStream carry their own.
#ifndef TESSERA_CLIENT_CPP_CLIENT_H_
#define TESSERA_CLIENT_CPP_CLIENT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "tessera/document.h"
#include "tessera/float16.h"
#include "tessera/v1/admin.grpc.pb.h"
#include "tessera/v1/ingest.grpc.pb.h"
#include "tessera/v1/query.grpc.pb.h"

namespace tessera::client {

struct ClientOptions {
  // host:port, or any gRPC target ("unix:/path", "dns:///host:port").
  std::string address = "127.0.0.1:50051";
  // Sent on every call as `authorization: Bearer <api_key>` when not empty.
  std::string api_key;
  // TLS: off unless `use_tls`. Without a root certificate file the system roots are used; a client
  // certificate and key (both or neither) turn on mutual TLS. Files are read by Connect.
  bool use_tls = false;
  std::string tls_root_cert_file;
  std::string tls_client_cert_file;
  std::string tls_client_key_file;
  // Overrides the name checked against the server certificate (for tests with an IP address).
  std::string tls_server_name;
  // Deadline of every unary call (and of Client::Upsert as a whole); absl::InfiniteDuration() for
  // none.
  absl::Duration timeout = absl::Seconds(30);
  // How long Connect waits for the channel to become ready; zero connects lazily on the first call.
  absl::Duration connect_timeout = absl::Seconds(10);
  // Largest message the client sends or receives (a Get of a large document, a big batch).
  int max_message_bytes = 256 << 20;
};

// A row-major token matrix (rows = tokens, cols = dim) in wire form: fp32 or fp16 values packed
// little-endian into `data`, exactly rows * cols * element size bytes. A value type.
struct TokenMatrix {
  uint32_t rows = 0;
  uint32_t cols = 0;
  v1::DType dtype = v1::DTYPE_FLOAT32;
  std::string data;

  // Copies rows × cols values (row-major) into packed bytes.
  static TokenMatrix FromFloat32(uint32_t rows, uint32_t cols, absl::Span<const float> values);
  static TokenMatrix FromFloat16(uint32_t rows, uint32_t cols, absl::Span<const Float16> values);
  // Rounds fp32 values to fp16 (round to nearest even), halving what travels.
  static TokenMatrix Float32AsFloat16(uint32_t rows, uint32_t cols, absl::Span<const float> values);
  // Adopts already-packed bytes; the size is checked by Validate, not here.
  static TokenMatrix FromPackedBytes(uint32_t rows, uint32_t cols, v1::DType dtype,
                                     std::string data);

  // OK when the dtype is known and the data size matches the shape; INVALID_ARGUMENT saying which
  // size was expected otherwise.
  absl::Status Validate() const;
  // The values as fp32, row-major (fp16 widens exactly). Errors as Validate.
  absl::StatusOr<std::vector<float>> ToFloat32() const;
  // The proto form (copies the bytes; the rvalue overload moves them).
  v1::Matrix ToProto() const&;
  v1::Matrix ToProto() &&;
  // Takes over a proto matrix (its bytes are moved out). Errors as Validate.
  static absl::StatusOr<TokenMatrix> FromProto(v1::Matrix&& matrix);
};

// A page image's patch grid: prefix special tokens, rows × cols patches (row-major), suffix tokens.
struct PatchLayout {
  uint32_t rows = 0;
  uint32_t cols = 0;
  uint32_t prefix_tokens = 0;
  uint32_t suffix_tokens = 0;

  friend bool operator==(const PatchLayout& a, const PatchLayout& b) {
    return a.rows == b.rows && a.cols == b.cols && a.prefix_tokens == b.prefix_tokens &&
           a.suffix_tokens == b.suffix_tokens;
  }
};

// One document to upsert.
struct DocumentInput {
  std::string id;
  TokenMatrix tokens;  // num_tokens × dim
  std::optional<PatchLayout> layout;
  Attributes attributes;  // tessera/document.h: field → int64 | double | string
  // For a collection with a sparse field (v1::CollectionSchema::sparse): term ids (unique, any
  // order) and weights (finite, ≥ 0), e.g. BM25 term frequencies.
  std::optional<SparseVector> sparse;
};

// The server's answer for one document of an upsert batch.
struct DocumentResult {
  std::string id;
  absl::Status status;  // OK = stored durably
  uint64_t version = 0;
  uint32_t num_vectors = 0;
};

// A stored document as Get returns it.
struct StoredDocument {
  std::string id;
  uint64_t version = 0;
  uint32_t num_tokens = 0;  // as sent, before pooling
  std::optional<PatchLayout> layout;
  Attributes attributes;
  // The rerank vectors: num_vectors × dim, row-major, widened to fp32.
  uint32_t num_vectors = 0;
  uint32_t dim = 0;
  v1::DType stored_dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<float> vectors;
  // Vector v pools original tokens members[member_offsets[v] .. member_offsets[v + 1]).
  std::vector<uint32_t> member_offsets;
  std::vector<uint32_t> members;
  std::optional<SparseVector> sparse;  // as stored, indices increasing
};

struct SearchOptions {
  uint32_t k = 10;
  // N documents scored exactly, ⌈N / shards⌉ per shard; 0 = server default: max(10k, 100), on
  // the centroid index up to max(40k, 400) as a shard grows past 262,144 vectors.
  uint32_t num_candidates = 0;
  uint32_t per_token_candidates = 0;  // 0 = server default
  uint32_t nprobe = 0;                // centroid index: centroids probed per token; 0 = default
  Filter filter;                      // tessera/document.h; empty matches everything
  bool exhaustive = false;
  bool explain = false;
  // Router: when a shard has no replica that answers, return the other shards' hits (listed in
  // SearchResult::missing_shards) instead of failing with UNAVAILABLE.
  bool allow_partial_results = false;
  // Each hit's attributes (SearchHit::attributes): all, or only attribute_fields.
  bool with_attributes = false;
  std::vector<std::string> attribute_fields;
  // Grouped results: with group_by set, SearchResult::groups holds the best `groups` groups
  // (0 = k) of documents sharing a value of that attribute, each with its best group_size hits
  // (1 … 100).
  std::string group_by;
  uint32_t group_size = 1;
  uint32_t groups = 0;
  // Sparse and hybrid retrieval (v1::SearchRequest.sparse_query): a sparse query alone (the
  // query matrix empty) or with the query matrix, the lanes fused by `fusion` (unset weights 1,
  // rrf_k 60), each lane's best fusion_candidates (0 = k) fused; rerank orders the fused
  // candidates by exact MaxSim.
  std::optional<SparseVector> sparse_query;
  v1::Fusion fusion = v1::FUSION_RRF;
  std::optional<double> dense_weight;
  std::optional<double> sparse_weight;
  std::optional<double> rrf_k;
  uint32_t fusion_candidates = 0;
  bool rerank = false;
};

struct TokenMatch {
  uint32_t query_token = 0;
  uint32_t document_vector = 0;
  float similarity = 0;
  std::vector<uint32_t> covered_tokens;
};

struct SearchHit {
  std::string id;
  float score = 0;
  uint64_t version = 0;
  std::vector<TokenMatch> explanation;  // with SearchOptions::explain
  Attributes attributes;                // with SearchOptions::with_attributes
  // Sparse and hybrid searches: the hit's MaxSim when known, its sparse score when it was in the
  // sparse lane.
  std::optional<float> dense_score;
  std::optional<float> sparse_score;
};

struct SearchGroup {
  AttributeValue value;         // of the group_by attribute
  std::vector<SearchHit> hits;  // best first
};

struct SearchTimings {
  double candidates_ms = 0;
  double fetch_ms = 0;
  double rerank_ms = 0;
  double total_ms = 0;
  double fanout_ms = 0;  // router: the scatter-gather to the shard nodes
};

struct SearchResult {
  std::vector<SearchHit> hits;      // best first
  std::vector<SearchGroup> groups;  // with SearchOptions::group_by: best first (hits empty)
  SearchTimings timings;
  uint64_t documents_scored = 0;
  bool exhaustive = false;
  std::vector<uint32_t> missing_shards;  // with allow_partial_results
};

struct ScrollOptions {
  Filter filter;
  std::string after;     // the previous page's next_after; empty: from the first id
  uint32_t limit = 100;  // 1 … 10000
  bool with_attributes = false;
  std::vector<std::string> attribute_fields;  // with_attributes: only these; empty: all
};

struct ScrolledDocument {
  std::string id;
  uint64_t version = 0;
  Attributes attributes;
};

struct ScrollPage {
  std::vector<ScrolledDocument> documents;  // ascending id
  std::string next_after;                   // empty: the last page
};

// One search of a SearchBatch.
struct SearchQuery {
  std::string collection;
  TokenMatrix query;  // query tokens × dim
  SearchOptions options;
};

struct CollectionInfo {
  v1::CollectionSchema schema;
  v1::CollectionStats stats;
  std::vector<v1::ShardStatus> shards;  // router: each shard's replicas, nodes and state
};

// Limits for Client::Upsert's split of a document list into stream messages.
struct UpsertOptions {
  size_t max_batch_documents = 64;
  size_t max_batch_bytes = 4 << 20;  // token bytes per message; a larger document goes alone
  size_t max_in_flight = 4;          // batches written before their results are read
};

// One open Upsert stream: Write a batch, Read its results (in order, one response per batch),
// Finish. Writing ahead of reading pipelines batches (the server acknowledges them in order).
// Thread-compatible: use one stream from one thread at a time.
class UpsertStream {
 public:
  ~UpsertStream();
  UpsertStream(const UpsertStream&) = delete;
  UpsertStream& operator=(const UpsertStream&) = delete;

  // Sends one batch (one UpsertRequest). INVALID_ARGUMENT for a malformed token matrix (nothing is
  // sent); ABORTED once the stream is closed — Read then returns the results still pending and
  // finally the call's status.
  absl::Status Write(std::vector<DocumentInput> documents);
  // The results of the oldest batch not yet read, one per document in the order written. When the
  // server has no more responses: its final status if that is an error, OUT_OF_RANGE otherwise.
  absl::StatusOr<std::vector<DocumentResult>> Read();
  // Half-closes the stream (no more Writes) and returns the call's final status. Results not read
  // yet are discarded, so Read one response per written batch first. Idempotent.
  absl::Status Finish();
  // Cancels the call; the server keeps what it acknowledged.
  void Cancel();

 private:
  friend class Client;
  UpsertStream(std::string collection, std::unique_ptr<grpc::ClientContext> context,
               v1::IngestService::Stub* stub);

  absl::Status FinishCall();

  std::string collection_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::UpsertRequest, v1::UpsertResponse>> stream_;
  std::deque<size_t> pending_sizes_;  // documents per batch written and not yet read
  bool writes_done_ = false;
  bool finished_ = false;
  absl::Status final_status_;
};

// A connection to one Tessera server. Thread-safe: any number of threads may issue calls at once
// (they share one HTTP/2 channel).
class Client {
 public:
  // Builds the channel (reading the TLS files) and, unless options.connect_timeout is zero, waits
  // for it to become ready. INVALID_ARGUMENT for inconsistent options, NOT_FOUND for a missing
  // certificate file, UNAVAILABLE when the server cannot be reached in time.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  const ClientOptions& options() const { return options_; }

  // AdminService.
  // The schema as stored, defaults filled in. ALREADY_EXISTS, INVALID_ARGUMENT.
  // `replicas`: copies of each shard on distinct shard nodes (a router; standalone holds 1).
  absl::StatusOr<v1::CollectionSchema> CreateCollection(const v1::CollectionSchema& schema,
                                                        uint32_t replicas = 1);
  absl::Status DropCollection(const std::string& name);
  // Sorted names.
  absl::StatusOr<std::vector<std::string>> ListCollections();
  absl::StatusOr<CollectionInfo> GetCollection(const std::string& name);
  absl::Status Flush(const std::string& name);

  // Snapshots (AdminService; tessera/snapshot.h has the archive format). A snapshot id names its
  // collection ("papers@20261206T030455Z-1f0c9a2b"). NOT_FOUND naming an unknown collection or
  // id; restores: ALREADY_EXISTS for a taken name, INVALID_ARGUMENT for a bad one, DATA_LOSS naming
  // the file of a corrupt or truncated archive. The streams have no deadline.
  absl::StatusOr<v1::SnapshotInfo> CreateSnapshot(const std::string& collection);
  // Oldest first.
  absl::StatusOr<std::vector<v1::SnapshotInfo>> ListSnapshots(const std::string& collection);
  absl::Status DeleteSnapshot(const std::string& id);
  // The snapshot's archive, piece by piece, to `sink` (whose error stops the download).
  absl::Status DownloadSnapshot(const std::string& id,
                                const std::function<absl::Status(absl::string_view)>& sink);
  // The archive written to `path` (replaced if it exists; removed again when the download fails).
  absl::Status DownloadSnapshotToFile(const std::string& id, const std::string& path);
  // Restores snapshot `id`, held by the server, into new collection `new_collection`.
  absl::StatusOr<v1::SnapshotInfo> RestoreSnapshot(const std::string& id,
                                                   const std::string& new_collection);
  // Uploads the archive at `path` (from DownloadSnapshotToFile, possibly of another server) and
  // restores it into new collection `new_collection`.
  absl::StatusOr<v1::SnapshotInfo> RestoreSnapshotFromFile(const std::string& path,
                                                           const std::string& new_collection);

  // IngestService.
  // Sends `documents` over one Upsert stream in batches (see UpsertOptions) and returns one result
  // per document, in input order. A non-OK status means the stream failed; documents whose batch
  // was acknowledged before that are stored, the others may or may not be.
  absl::StatusOr<std::vector<DocumentResult>> Upsert(const std::string& collection,
                                                     std::vector<DocumentInput> documents,
                                                     const UpsertOptions& options = {});
  // Opens a stream for a long ingest. `timeout` bounds the whole stream (default: no deadline).
  absl::StatusOr<std::unique_ptr<UpsertStream>> OpenUpsertStream(
      const std::string& collection, absl::Duration timeout = absl::InfiniteDuration());
  // For each id, whether it existed.
  absl::StatusOr<std::vector<bool>> Delete(const std::string& collection,
                                           const std::vector<std::string>& ids);
  // Deletes every document matching `filter` (not empty), durably; returns how many.
  absl::StatusOr<uint64_t> DeleteMatching(const std::string& collection, const Filter& filter);
  // NOT_FOUND for an unknown id.
  absl::StatusOr<StoredDocument> Get(const std::string& collection, const std::string& id);

  // QueryService.
  absl::StatusOr<SearchResult> Search(const std::string& collection, const TokenMatrix& query,
                                      const SearchOptions& options = {});
  // One result per query, in order.
  absl::StatusOr<std::vector<SearchResult>> SearchBatch(const std::vector<SearchQuery>& queries);
  // Documents matching `filter` (empty: all).
  absl::StatusOr<uint64_t> Count(const std::string& collection, const Filter& filter = {});
  // One page of the documents matching options.filter, ascending by id, after options.after.
  absl::StatusOr<ScrollPage> Scroll(const std::string& collection, const ScrollOptions& options);

 private:
  Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel);
  // A context with the API key and, when `deadline` is finite, the deadline.
  std::unique_ptr<grpc::ClientContext> MakeContext(absl::Duration timeout) const;

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
  std::unique_ptr<v1::IngestService::Stub> ingest_;
  std::unique_ptr<v1::QueryService::Stub> query_;
};

namespace internal {

// Request building and response decoding, exposed for tests.
v1::UpsertRequest BuildUpsertRequest(const std::string& collection,
                                     std::vector<DocumentInput> documents);
v1::SearchRequest BuildSearchRequest(const std::string& collection, const TokenMatrix& query,
                                     const SearchOptions& options);
v1::Filter FilterToProto(const Filter& filter);
absl::StatusOr<std::vector<DocumentResult>> DecodeUpsertResponse(const v1::UpsertResponse& response,
                                                                 size_t expected_results);
absl::StatusOr<StoredDocument> DecodeGetResponse(v1::GetResponse&& response);
SearchResult DecodeSearchResponse(const v1::SearchResponse& response);
Attributes DecodeAttributes(const google::protobuf::Map<std::string, v1::AttributeValue>& map);
// Splits `documents` into batches by UpsertOptions' document and byte limits, keeping order.
std::vector<std::vector<DocumentInput>> SplitIntoBatches(std::vector<DocumentInput> documents,
                                                         const UpsertOptions& options);

}  // namespace internal
}  // namespace tessera::client

#endif  // TESSERA_CLIENT_CPP_CLIENT_H_
