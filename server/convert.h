// Conversions between the tessera.v1 protocol messages and the index library's types. Every
// conversion from the wire validates what it reads and says which field was wrong.
#ifndef TESSERA_SERVER_CONVERT_H_
#define TESSERA_SERVER_CONVERT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/collection.h"
#include "tessera/v1/admin.pb.h"
#include "tessera/v1/common.pb.h"
#include "tessera/v1/ingest.pb.h"
#include "tessera/v1/query.pb.h"
#include "tessera/v1/shard.pb.h"

namespace tessera::server {

// A packed matrix → fp32 values (rows × cols). INVALID_ARGUMENT for an unknown dtype, a data length
// that is not rows × cols × itemsize, or cols ≠ expected_cols (when expected_cols > 0). `field`
// names the matrix in messages ("documents[3].tokens").
absl::StatusOr<std::vector<float>> DecodeMatrix(const v1::Matrix& matrix, int64_t expected_cols,
                                                const std::string& field);
// fp32 values → a packed matrix of `dtype`.
void EncodeMatrix(const float* values, int64_t rows, int64_t cols, VectorDtype dtype,
                  v1::Matrix* out);

absl::StatusOr<CollectionSchema> SchemaFromProto(const v1::CollectionSchema& proto);
// Sparse and hybrid retrieval. SparseField → SparseScoring (defaults for unset k1, b; unknown
// modifier: INVALID_ARGUMENT); the wire's sparse vectors as they are (the collection validates);
// a SearchRequest's sparse query and fusion options (INVALID_ARGUMENT for fusion options without
// a sparse query, or an unknown fusion); the BM25 statistics a router gathers and passes down.
absl::StatusOr<SparseScoring> SparseFieldFromProto(const v1::SparseField& proto);
SparseVector SparseFromProto(const v1::SparseVector& proto);
void SparseToProto(const SparseVector& vector, v1::SparseVector* out);
absl::Status HybridOptionsFromProto(const v1::SearchRequest& request, HybridOptions* out);
void SparseStatisticsToProto(const SparseStatistics& statistics, v1::SparseStatistics* out);
// INVALID_ARGUMENT when terms and doc_freq differ in length.
absl::StatusOr<SparseStatistics> SparseStatisticsFromProto(const v1::SparseStatistics& proto);
void SchemaToProto(const CollectionSchema& schema, v1::CollectionSchema* out);
void StatsToProto(const CollectionStats& stats, v1::CollectionStats* out);
// The inverse for the fields the wire carries (a shard node's statistics at the router); the
// training counts and times it does not carry stay 0.
CollectionStats StatsFromProto(const v1::CollectionStats& proto);

absl::StatusOr<Filter> FilterFromProto(const v1::Filter& proto);
// INVALID_ARGUMENT for a delete by filter that also names ids.
absl::Status CheckDeleteByFilter(const v1::DeleteRequest& request);
// ScrollRequest → ScrollOptions (limit 0 = 100; the collection checks the rest).
absl::StatusOr<ScrollOptions> ScrollOptionsFromProto(const v1::ScrollRequest& request);
// SearchRequest → SearchOptions as every search handler reads it (k 0 = 10; the numbers unclamped:
// the collection checks them and names the value); INVALID_ARGUMENT for a bad filter. The query
// matrix (DecodeMatrix), the deadline and whole_shards are the caller's.
absl::StatusOr<SearchOptions> SearchOptionsFromProto(const v1::SearchRequest& request);
// A page of Collection::Scroll onto the wire.
void ScrollPageToProto(ScrollPage page, v1::ScrollResponse* out);

// documents[index] of an UpsertRequest → Document (dim checked against `dim`).
absl::StatusOr<Document> DocumentFromProto(const v1::Document& proto, int64_t dim, int index);

// The vectors go out in the document's dtype: its stored bytes as they are when it carries them
// (Get with GetOptions::stored_bytes; the wire packs matrices the same way), else its fp32 vectors
// encoded. Takes the document by value so that the bytes move rather than copy.
void StoredDocumentToProto(StoredDocument document, v1::GetResponse* out);
void SearchResultToProto(const SearchResult& result, v1::SearchResponse* out);
// A shard node's answer to a router's search (tessera/merge.h), and back at the router, where
// the hits move out of `proto`.
void ShardSearchResultToProto(const SearchResult& result, v1::ShardSearchResponse* out);
SearchResult SearchResultFromShardProto(v1::ShardSearchResponse* proto);

}  // namespace tessera::server

#endif  // TESSERA_SERVER_CONVERT_H_
