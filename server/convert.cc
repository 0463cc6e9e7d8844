#include "server/convert.h"

#include <algorithm>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tessera/document.h"
#include "tessera/status_macros.h"
#include "tessera/wire/attribute.h"
#include "tessera/wire/matrix.h"

namespace tessera::server {
namespace {

absl::Status Invalid(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// A uint32 field as an int: values beyond int's range are refused here, named as sent (the
// schema's own checks give the meaningful ranges of everything that fits).
absl::Status ToInt(const std::string& field, uint32_t value, int* out) {
  if (value > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
    return Invalid(field,
                   absl::StrCat(value, ", expected at most ", std::numeric_limits<int32_t>::max()));
  }
  *out = static_cast<int>(value);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<float>> DecodeMatrix(const v1::Matrix& matrix, int64_t expected_cols,
                                                const std::string& field) {
  TESSERA_RETURN_IF_ERROR(wire::CheckMatrix(matrix, expected_cols, field));
  std::vector<float> values(static_cast<size_t>(matrix.rows()) * matrix.cols());
  wire::UnpackToFloat32(matrix.data().data(), values.size(), matrix.dtype(), values.data());
  return values;
}

void EncodeMatrix(const float* values, int64_t rows, int64_t cols, VectorDtype dtype,
                  v1::Matrix* out) {
  wire::EncodeMatrix(values, static_cast<uint32_t>(rows), static_cast<uint32_t>(cols),
                     dtype == VectorDtype::kFloat32 ? v1::DTYPE_FLOAT32 : v1::DTYPE_FLOAT16, out);
}

absl::StatusOr<SparseScoring> SparseFieldFromProto(const v1::SparseField& proto) {
  SparseScoring scoring;
  switch (proto.modifier()) {
    case v1::SparseField::MODIFIER_UNSPECIFIED:
    case v1::SparseField::MODIFIER_IDF:
      scoring.idf = true;
      break;
    case v1::SparseField::MODIFIER_NONE:
      scoring.idf = false;
      break;
    default:
      return Invalid("schema.sparse.modifier",
                     absl::StrCat("unknown value ", static_cast<int>(proto.modifier()),
                                  ", expected MODIFIER_IDF or MODIFIER_NONE"));
  }
  if (proto.has_k1()) scoring.k1 = proto.k1();
  if (proto.has_b()) scoring.b = proto.b();
  return scoring;
}

SparseVector SparseFromProto(const v1::SparseVector& proto) {
  return SparseVector{{proto.indices().begin(), proto.indices().end()},
                      {proto.values().begin(), proto.values().end()}};
}

void SparseToProto(const SparseVector& vector, v1::SparseVector* out) {
  out->mutable_indices()->Add(vector.indices.begin(), vector.indices.end());
  out->mutable_values()->Add(vector.values.begin(), vector.values.end());
}

absl::Status HybridOptionsFromProto(const v1::SearchRequest& request, HybridOptions* out) {
  if (!request.has_sparse_query()) {
    if (request.fusion() != v1::FUSION_UNSPECIFIED || request.rerank() ||
        request.fusion_candidates() != 0) {
      return Invalid("sparse_query",
                     "unset, but fusion options were given: a hybrid search "
                     "needs a sparse query");
    }
    return absl::OkStatus();
  }
  out->sparse_query = SparseFromProto(request.sparse_query());
  switch (request.fusion()) {
    case v1::FUSION_UNSPECIFIED:
    case v1::FUSION_RRF:
      out->fusion = FusionMethod::kRrf;
      break;
    case v1::FUSION_SCORE:
      out->fusion = FusionMethod::kScore;
      break;
    default:
      return Invalid("fusion", absl::StrCat("unknown value ", static_cast<int>(request.fusion()),
                                            ", expected FUSION_RRF or FUSION_SCORE"));
  }
  if (request.has_dense_weight()) out->dense_weight = request.dense_weight();
  if (request.has_sparse_weight()) out->sparse_weight = request.sparse_weight();
  if (request.has_rrf_k()) out->rrf_k = request.rrf_k();
  out->candidates = request.fusion_candidates();
  out->rerank = request.rerank();
  return absl::OkStatus();
}

void SparseStatisticsToProto(const SparseStatistics& statistics, v1::SparseStatistics* out) {
  out->set_num_documents(static_cast<uint64_t>(statistics.num_documents));
  out->set_total_length(statistics.total_length);
  // In term order, so that the bytes do not depend on the hash map's.
  std::vector<std::pair<uint32_t, int64_t>> terms(statistics.doc_freq.begin(),
                                                  statistics.doc_freq.end());
  std::sort(terms.begin(), terms.end());
  for (const auto& [term, df] : terms) {
    out->add_terms(term);
    out->add_doc_freq(static_cast<uint64_t>(df));
  }
}

absl::StatusOr<SparseStatistics> SparseStatisticsFromProto(const v1::SparseStatistics& proto) {
  if (proto.terms_size() != proto.doc_freq_size()) {
    return Invalid("sparse_statistics",
                   absl::StrCat(proto.terms_size(), " terms but ", proto.doc_freq_size(),
                                " doc_freq, expected one per term"));
  }
  SparseStatistics statistics;
  statistics.num_documents = static_cast<int64_t>(
      std::min<uint64_t>(proto.num_documents(), std::numeric_limits<int64_t>::max()));
  statistics.total_length = proto.total_length();
  for (int i = 0; i < proto.terms_size(); ++i) {
    statistics.doc_freq[proto.terms(i)] = static_cast<int64_t>(
        std::min<uint64_t>(proto.doc_freq(i), std::numeric_limits<int64_t>::max()));
  }
  return statistics;
}

absl::StatusOr<CollectionSchema> SchemaFromProto(const v1::CollectionSchema& proto) {
  CollectionSchema schema;
  schema.name = proto.name();
  schema.dim = proto.dim();
  switch (proto.dtype()) {
    case v1::DTYPE_UNSPECIFIED:
    case v1::DTYPE_FLOAT16:
      schema.dtype = VectorDtype::kFloat16;
      break;
    case v1::DTYPE_FLOAT32:
      schema.dtype = VectorDtype::kFloat32;
      break;
    default:
      return Invalid("schema.dtype", absl::StrCat("unknown value ", proto.dtype()));
  }
  schema.num_shards = 1;
  if (proto.num_shards() != 0) {
    TESSERA_RETURN_IF_ERROR(ToInt("schema.num_shards", proto.num_shards(), &schema.num_shards));
  }
  schema.pooling = PoolingSpec{};
  if (proto.has_hierarchical()) {
    const v1::HierarchicalPooling& h = proto.hierarchical();
    TokenPoolingOptions options;
    if (h.pool_factor() < 1 || h.pool_factor() > 64) {
      return Invalid("schema.hierarchical.pool_factor",
                     absl::StrCat(h.pool_factor(), ", expected 1 … 64"));
    }
    options.pool_factor = static_cast<int>(h.pool_factor());
    switch (h.method()) {
      case v1::HierarchicalPooling::METHOD_UNSPECIFIED:
      case v1::HierarchicalPooling::METHOD_WARD:
        options.method = PoolingMethod::kWard;
        break;
      case v1::HierarchicalPooling::METHOD_REFERENCE:
        options.method = PoolingMethod::kReference;
        break;
      default:
        return Invalid("schema.hierarchical.method",
                       absl::StrCat("unknown value ", h.method(),
                                    ", expected METHOD_WARD (1) or METHOD_REFERENCE (2)"));
    }
    TESSERA_RETURN_IF_ERROR(ToInt("schema.hierarchical.protected_tokens", h.protected_tokens(),
                                  &options.protected_tokens));
    options.renormalize = h.renormalize();
    // Range-checked with the rest of the schema (ValidateSchema).
    TESSERA_RETURN_IF_ERROR(
        ToInt("schema.hierarchical.min_vectors", h.min_vectors(), &options.min_vectors));
    options.max_merge_height =
        h.has_max_merge_height() ? h.max_merge_height() : DefaultMaxMergeHeight(options.method);
    schema.pooling.hierarchical = options;
  }
  if (proto.has_spatial()) {
    const v1::SpatialPooling& s = proto.spatial();
    SpatialPoolingOptions options;
    switch (s.mode()) {
      case v1::SpatialPooling::MODE_ROWS:
        options.mode = SpatialMode::kRows;
        break;
      case v1::SpatialPooling::MODE_COLUMNS:
        options.mode = SpatialMode::kColumns;
        break;
      case v1::SpatialPooling::MODE_TILES:
        options.mode = SpatialMode::kTiles;
        break;
      case v1::SpatialPooling::MODE_ROW_WINDOWS:
        options.mode = SpatialMode::kRowWindows;
        break;
      case v1::SpatialPooling::MODE_GLOBAL:
        options.mode = SpatialMode::kGlobal;
        break;
      default:
        return Invalid("schema.spatial.mode", absl::StrCat("unknown value ", s.mode()));
    }
    // The sizes the mode uses must be given (proto3 sends an unset one as 0, which would pool
    // with a size nobody asked for); the others may be 0 and keep their defaults, so that a
    // schema read back (SchemaToProto sends every size) can be sent again.
    const bool tiles = options.mode == SpatialMode::kTiles;
    const bool windows = options.mode == SpatialMode::kRowWindows;
    for (const auto& [field, value, out, used] :
         {std::tuple{"tile_rows", s.tile_rows(), &options.tile_rows, tiles},
          std::tuple{"tile_cols", s.tile_cols(), &options.tile_cols, tiles},
          std::tuple{"window_rows", s.window_rows(), &options.window_rows, windows},
          std::tuple{"window_stride", s.window_stride(), &options.window_stride, windows}}) {
      const std::string name = absl::StrCat("schema.spatial.", field);
      if (value == 0 && used) {
        return Invalid(name, absl::StrCat("0, expected ≥ 1 for mode ",
                                          v1::SpatialPooling::Mode_Name(s.mode())));
      }
      if (value > 0) TESSERA_RETURN_IF_ERROR(ToInt(name, value, out));
    }
    options.keep_special_tokens = s.keep_special_tokens();
    options.renormalize = s.renormalize();
    schema.pooling.spatial = options;
  }
  if (!proto.has_hierarchical() && !proto.has_spatial()) {
    schema.pooling = CollectionSchema::DefaultPooling();
  }
  if (proto.has_candidates()) {
    const v1::CandidateVectors& c = proto.candidates();
    switch (c.kind()) {
      case v1::CandidateVectors::KIND_UNSPECIFIED:
      case v1::CandidateVectors::KIND_POOLED:
        schema.candidates.kind = CandidateSpec::Kind::kPooled;
        break;
      case v1::CandidateVectors::KIND_GLOBAL_MEAN:
        schema.candidates.kind = CandidateSpec::Kind::kGlobalMean;
        break;
      default:
        return Invalid("schema.candidates.kind",
                       absl::StrCat("unknown value ", c.kind(),
                                    ", expected KIND_POOLED (1) or KIND_GLOBAL_MEAN (2)"));
    }
    if (c.pool_factor() > 0) {
      TESSERA_RETURN_IF_ERROR(
          ToInt("schema.candidates.pool_factor", c.pool_factor(), &schema.candidates.pool_factor));
    }
    if (!c.factory().empty()) schema.candidates.factory = c.factory();
    if (c.residual_bits() > 0) {
      TESSERA_RETURN_IF_ERROR(ToInt("schema.candidates.residual_bits", c.residual_bits(),
                                    &schema.candidates.residual_bits));
    }
    if (c.centroid_min_vectors() > 0) {
      schema.candidates.centroid_min_vectors = static_cast<int64_t>(
          std::min<uint64_t>(c.centroid_min_vectors(), std::numeric_limits<int64_t>::max()));
    }
    schema.candidates.rerank_from_codes = c.rerank_from_codes();
    if (c.centroid_min_training_vectors() > 0) {
      schema.candidates.centroid_min_training_vectors = static_cast<int64_t>(std::min<uint64_t>(
          c.centroid_min_training_vectors(), std::numeric_limits<int64_t>::max()));
    }
  }
  if (proto.has_sparse()) {
    TESSERA_ASSIGN_OR_RETURN(schema.sparse, SparseFieldFromProto(proto.sparse()));
  }
  for (const auto& [field, type] : proto.attributes()) {
    switch (type) {
      case v1::ATTRIBUTE_TYPE_INT64:
        schema.attributes[field] = AttributeType::kInt64;
        break;
      case v1::ATTRIBUTE_TYPE_DOUBLE:
        schema.attributes[field] = AttributeType::kDouble;
        break;
      case v1::ATTRIBUTE_TYPE_STRING:
        schema.attributes[field] = AttributeType::kString;
        break;
      default:
        return Invalid(absl::StrCat("schema.attributes[", QuotedForMessage(field), "]"),
                       absl::StrCat("type ", static_cast<int>(type),
                                    type == v1::ATTRIBUTE_TYPE_UNSPECIFIED ? " (unspecified)" : "",
                                    ", expected INT64, DOUBLE or STRING"));
    }
  }
  return schema;
}

void SchemaToProto(const CollectionSchema& schema, v1::CollectionSchema* out) {
  out->set_name(schema.name);
  out->set_dim(static_cast<uint32_t>(schema.dim));
  out->set_dtype(schema.dtype == VectorDtype::kFloat16 ? v1::DTYPE_FLOAT16 : v1::DTYPE_FLOAT32);
  out->set_num_shards(static_cast<uint32_t>(schema.num_shards));
  if (schema.pooling.hierarchical.has_value()) {
    const TokenPoolingOptions& h = *schema.pooling.hierarchical;
    v1::HierarchicalPooling* p = out->mutable_hierarchical();
    p->set_pool_factor(static_cast<uint32_t>(h.pool_factor));
    p->set_method(h.method == PoolingMethod::kReference ? v1::HierarchicalPooling::METHOD_REFERENCE
                                                        : v1::HierarchicalPooling::METHOD_WARD);
    p->set_protected_tokens(static_cast<uint32_t>(h.protected_tokens));
    p->set_renormalize(h.renormalize);
    p->set_min_vectors(static_cast<uint32_t>(h.min_vectors));
    p->set_max_merge_height(h.max_merge_height);
  }
  if (schema.pooling.spatial.has_value()) {
    const SpatialPoolingOptions& s = *schema.pooling.spatial;
    v1::SpatialPooling* p = out->mutable_spatial();
    static constexpr v1::SpatialPooling::Mode kModes[] = {
        v1::SpatialPooling::MODE_ROWS, v1::SpatialPooling::MODE_COLUMNS,
        v1::SpatialPooling::MODE_TILES, v1::SpatialPooling::MODE_ROW_WINDOWS,
        v1::SpatialPooling::MODE_GLOBAL};
    p->set_mode(kModes[static_cast<int>(s.mode)]);
    p->set_tile_rows(static_cast<uint32_t>(s.tile_rows));
    p->set_tile_cols(static_cast<uint32_t>(s.tile_cols));
    p->set_window_rows(static_cast<uint32_t>(s.window_rows));
    p->set_window_stride(static_cast<uint32_t>(s.window_stride));
    p->set_keep_special_tokens(s.keep_special_tokens);
    p->set_renormalize(s.renormalize);
  }
  v1::CandidateVectors* c = out->mutable_candidates();
  c->set_kind(schema.candidates.kind == CandidateSpec::Kind::kGlobalMean
                  ? v1::CandidateVectors::KIND_GLOBAL_MEAN
                  : v1::CandidateVectors::KIND_POOLED);
  c->set_pool_factor(static_cast<uint32_t>(schema.candidates.pool_factor));
  c->set_factory(schema.candidates.factory);
  c->set_residual_bits(static_cast<uint32_t>(EffectiveResidualBits(schema.candidates)));
  c->set_centroid_min_vectors(static_cast<uint64_t>(schema.candidates.centroid_min_vectors));
  c->set_centroid_min_training_vectors(
      static_cast<uint64_t>(EffectiveMinTrainingVectors(schema.candidates)));
  c->set_rerank_from_codes(schema.candidates.rerank_from_codes);
  if (schema.sparse.has_value()) {
    v1::SparseField* sparse = out->mutable_sparse();
    sparse->set_modifier(schema.sparse->idf ? v1::SparseField::MODIFIER_IDF
                                            : v1::SparseField::MODIFIER_NONE);
    sparse->set_k1(schema.sparse->k1);
    sparse->set_b(schema.sparse->b);
  }
  for (const auto& [field, type] : schema.attributes) {
    (*out->mutable_attributes())[field] = type == AttributeType::kInt64 ? v1::ATTRIBUTE_TYPE_INT64
                                          : type == AttributeType::kDouble
                                              ? v1::ATTRIBUTE_TYPE_DOUBLE
                                              : v1::ATTRIBUTE_TYPE_STRING;
  }
}

void StatsToProto(const CollectionStats& stats, v1::CollectionStats* out) {
  out->set_documents(stats.documents);
  out->set_original_tokens(stats.original_tokens);
  out->set_rerank_vectors(stats.rerank_vectors);
  out->set_candidate_vectors(stats.candidate_vectors);
  out->set_disk_bytes(stats.disk_bytes);
  out->set_resident_bytes(stats.resident_bytes);
  out->set_candidate_bytes(stats.candidate_bytes);
  out->set_training_shards(stats.training_shards);
  out->set_rerank_segments(stats.segments.rerank_segments);
  out->set_rerank_segment_bytes(stats.segments.rerank_segment_bytes);
  out->set_rerank_unflushed_bytes(stats.segments.rerank_unflushed_bytes);
  out->set_code_segments(stats.segments.code_segments);
  out->set_code_segment_bytes(stats.segments.code_segment_bytes);
  out->set_code_unflushed_bytes(stats.segments.code_unflushed_bytes);
  out->set_vectors_per_document(stats.vectors_per_document);
  out->set_disk_bytes_per_original_token(stats.disk_bytes_per_original_token);
  out->set_disk_bytes_per_rerank_vector(stats.disk_bytes_per_rerank_vector);
  for (const std::string& index : stats.candidate_indexes) out->add_candidate_indexes(index);
}

CollectionStats StatsFromProto(const v1::CollectionStats& proto) {
  CollectionStats stats;
  stats.documents = static_cast<int64_t>(proto.documents());
  stats.original_tokens = static_cast<int64_t>(proto.original_tokens());
  stats.rerank_vectors = static_cast<int64_t>(proto.rerank_vectors());
  stats.candidate_vectors = static_cast<int64_t>(proto.candidate_vectors());
  stats.disk_bytes = static_cast<int64_t>(proto.disk_bytes());
  stats.resident_bytes = static_cast<int64_t>(proto.resident_bytes());
  stats.candidate_bytes = static_cast<int64_t>(proto.candidate_bytes());
  stats.training_shards = static_cast<int>(proto.training_shards());
  stats.segments.rerank_segments = static_cast<int64_t>(proto.rerank_segments());
  stats.segments.rerank_segment_bytes = static_cast<int64_t>(proto.rerank_segment_bytes());
  stats.segments.rerank_unflushed_bytes = static_cast<int64_t>(proto.rerank_unflushed_bytes());
  stats.segments.code_segments = static_cast<int64_t>(proto.code_segments());
  stats.segments.code_segment_bytes = static_cast<int64_t>(proto.code_segment_bytes());
  stats.segments.code_unflushed_bytes = static_cast<int64_t>(proto.code_unflushed_bytes());
  stats.vectors_per_document = proto.vectors_per_document();
  stats.disk_bytes_per_original_token = proto.disk_bytes_per_original_token();
  stats.disk_bytes_per_rerank_vector = proto.disk_bytes_per_rerank_vector();
  stats.candidate_indexes.assign(proto.candidate_indexes().begin(),
                                 proto.candidate_indexes().end());
  return stats;
}

namespace {

// `path` names the filter as a field ("filter", "filter.any_of[1]"); depth 1 at the top.
absl::StatusOr<Filter> FilterFromProtoAt(const v1::Filter& proto, const std::string& path,
                                         int depth) {
  // Refused before decoding deeper, so that no request recurses further than this bound.
  if (depth > kMaxFilterDepth) {
    return Invalid(path, absl::StrCat("nested ", depth, " deep, expected at most ", kMaxFilterDepth,
                                      " (any_of / none_of inside each other)"));
  }
  Filter filter;
  for (int i = 0; i < proto.all_of_size(); ++i) {
    const v1::Condition& c = proto.all_of(i);
    FilterCondition condition;
    condition.field = c.field();
    switch (c.op()) {
      case v1::Condition::OP_EQ:
        condition.op = FilterCondition::Op::kEq;
        break;
      case v1::Condition::OP_NE:
        condition.op = FilterCondition::Op::kNe;
        break;
      case v1::Condition::OP_LT:
        condition.op = FilterCondition::Op::kLt;
        break;
      case v1::Condition::OP_LE:
        condition.op = FilterCondition::Op::kLe;
        break;
      case v1::Condition::OP_GT:
        condition.op = FilterCondition::Op::kGt;
        break;
      case v1::Condition::OP_GE:
        condition.op = FilterCondition::Op::kGe;
        break;
      case v1::Condition::OP_IN:
        condition.op = FilterCondition::Op::kIn;
        break;
      case v1::Condition::OP_EXISTS:
        condition.op = FilterCondition::Op::kExists;
        break;
      case v1::Condition::OP_MISSING:
        condition.op = FilterCondition::Op::kMissing;
        break;
      case v1::Condition::OP_PREFIX:
        condition.op = FilterCondition::Op::kPrefix;
        break;
      default:
        return Invalid(absl::StrCat(path, ".all_of[", i, "].op"),
                       absl::StrCat("unknown value ", c.op()));
    }
    for (const v1::AttributeValue& value : c.values()) {
      absl::StatusOr<AttributeValue> decoded = wire::AttributeFromProto(value);
      if (!decoded.ok()) {
        return Invalid(absl::StrCat(path, ".all_of[", i, "].values"), "a value is not set");
      }
      condition.values.push_back(*std::move(decoded));
    }
    filter.all_of.push_back(std::move(condition));
  }
  for (int i = 0; i < proto.any_of_size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(
        Filter alternative,
        FilterFromProtoAt(proto.any_of(i), absl::StrCat(path, ".any_of[", i, "]"), depth + 1));
    filter.any_of.push_back(std::move(alternative));
  }
  for (int i = 0; i < proto.none_of_size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(
        Filter alternative,
        FilterFromProtoAt(proto.none_of(i), absl::StrCat(path, ".none_of[", i, "]"), depth + 1));
    filter.none_of.push_back(std::move(alternative));
  }
  return filter;
}

void HitToProto(const SearchHit& hit, v1::Hit* h) {
  h->set_id(hit.id);
  h->set_score(hit.score);
  h->set_version(hit.version);
  for (const TokenMatch& match : hit.explanation) {
    v1::TokenMatch* m = h->add_explanation();
    m->set_query_token(match.query_token);
    m->set_document_vector(match.document_vector);
    m->set_similarity(match.similarity);
    for (int32_t token : match.covered_tokens) m->add_covered_tokens(token);
  }
  for (const auto& [name, value] : hit.attributes) {
    wire::AttributeToProto(value, &(*h->mutable_attributes())[name]);
  }
  if (hit.dense_score.has_value()) h->set_dense_score(*hit.dense_score);
  if (hit.sparse_score.has_value()) h->set_sparse_score(*hit.sparse_score);
}

SearchHit HitFromProto(v1::Hit* h) {
  SearchHit hit;
  hit.id = std::move(*h->mutable_id());
  hit.score = h->score();
  hit.version = h->version();
  for (const v1::TokenMatch& m : h->explanation()) {
    TokenMatch match;
    match.query_token = m.query_token();
    match.document_vector = m.document_vector();
    match.similarity = m.similarity();
    match.covered_tokens.assign(m.covered_tokens().begin(), m.covered_tokens().end());
    hit.explanation.push_back(std::move(match));
  }
  // A value with none set (which no shard node sends) is left out, as the C++ client does.
  for (const auto& [name, value] : h->attributes()) {
    absl::StatusOr<AttributeValue> decoded = wire::AttributeFromProto(value);
    if (decoded.ok()) hit.attributes.emplace(name, *std::move(decoded));
  }
  if (h->has_dense_score()) hit.dense_score = h->dense_score();
  if (h->has_sparse_score()) hit.sparse_score = h->sparse_score();
  return hit;
}

}  // namespace

absl::StatusOr<Filter> FilterFromProto(const v1::Filter& proto) {
  return FilterFromProtoAt(proto, "filter", 1);
}

absl::Status CheckDeleteByFilter(const v1::DeleteRequest& request) {
  if (request.has_filter() && request.ids_size() > 0) {
    return Invalid("filter", absl::StrCat("set with ", request.ids_size(),
                                          " ids, expected ids or a filter, not both"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ScrollOptions> ScrollOptionsFromProto(const v1::ScrollRequest& request) {
  ScrollOptions options;
  TESSERA_ASSIGN_OR_RETURN(options.filter, FilterFromProto(request.filter()));
  options.after = request.after();
  options.limit = request.limit() == 0 ? 100 : request.limit();
  options.with_attributes = request.with_attributes();
  options.attribute_fields.assign(request.attribute_fields().begin(),
                                  request.attribute_fields().end());
  return options;
}

absl::StatusOr<SearchOptions> SearchOptionsFromProto(const v1::SearchRequest& request) {
  SearchOptions options;
  // The numbers go on as sent (every uint32 fits): the collection checks them against its limits
  // and names the value in its message.
  options.k = request.k() == 0 ? 10 : request.k();
  options.num_candidates = request.num_candidates();
  options.per_token_candidates = request.per_token_candidates();
  options.nprobe = request.nprobe();
  TESSERA_ASSIGN_OR_RETURN(options.filter, FilterFromProto(request.filter()));
  options.exhaustive = request.exhaustive();
  options.explain = request.explain();
  options.with_attributes = request.with_attributes();
  options.attribute_fields.assign(request.attribute_fields().begin(),
                                  request.attribute_fields().end());
  options.group_by = request.group_by();
  options.group_size = request.group_size();
  options.groups = request.groups();
  TESSERA_RETURN_IF_ERROR(HybridOptionsFromProto(request, &options.hybrid));
  return options;
}

void ScrollPageToProto(ScrollPage page, v1::ScrollResponse* out) {
  for (ScrolledDocument& document : page.documents) {
    v1::ScrolledDocument* d = out->add_documents();
    d->set_id(std::move(document.id));
    d->set_version(document.version);
    for (const auto& [name, value] : document.attributes) {
      wire::AttributeToProto(value, &(*d->mutable_attributes())[name]);
    }
  }
  out->set_next_after(std::move(page.next_after));
}

absl::StatusOr<Document> DocumentFromProto(const v1::Document& proto, int64_t dim, int index) {
  Document document;
  document.id = proto.id();
  const std::string field =
      absl::StrCat("documents[", index, "] (", QuotedForMessage(proto.id()), ").tokens");
  TESSERA_ASSIGN_OR_RETURN(document.tokens, DecodeMatrix(proto.tokens(), dim, field));
  document.num_tokens = proto.tokens().rows();
  document.dim = proto.tokens().cols();
  if (proto.has_layout()) {
    const v1::PatchGrid& grid = proto.layout();
    // Each within int32, so that the grid's token count cannot overflow; the document's own
    // validation compares it with the tokens sent.
    const std::string layout_field =
        absl::StrCat("documents[", index, "] (", QuotedForMessage(proto.id()), ").layout.");
    for (const auto& [name, value] :
         {std::pair{"rows", grid.rows()}, std::pair{"cols", grid.cols()},
          std::pair{"prefix_tokens", grid.prefix_tokens()},
          std::pair{"suffix_tokens", grid.suffix_tokens()}}) {
      int unused;
      TESSERA_RETURN_IF_ERROR(ToInt(absl::StrCat(layout_field, name), value, &unused));
    }
    document.layout =
        PatchGridLayout{grid.rows(), grid.cols(), grid.prefix_tokens(), grid.suffix_tokens()};
  }
  for (const auto& [name, value] : proto.attributes()) {
    absl::StatusOr<AttributeValue> decoded = wire::AttributeFromProto(value);
    if (!decoded.ok()) {
      return Invalid(
          absl::StrCat("documents[", index, "].attributes[", QuotedForMessage(name), "]"),
          "no value set");
    }
    document.attributes[name] = *std::move(decoded);
  }
  if (proto.has_sparse()) document.sparse = SparseFromProto(proto.sparse());
  return document;
}

void StoredDocumentToProto(StoredDocument document, v1::GetResponse* out) {
  out->set_id(std::move(document.id));
  out->set_version(document.version);
  out->set_num_tokens(static_cast<uint32_t>(document.num_tokens));
  if (document.layout.has_value()) {
    v1::PatchGrid* grid = out->mutable_layout();
    grid->set_rows(static_cast<uint32_t>(document.layout->rows));
    grid->set_cols(static_cast<uint32_t>(document.layout->cols));
    grid->set_prefix_tokens(static_cast<uint32_t>(document.layout->prefix_tokens));
    grid->set_suffix_tokens(static_cast<uint32_t>(document.layout->suffix_tokens));
  }
  for (const auto& [name, value] : document.attributes) {
    wire::AttributeToProto(value, &(*out->mutable_attributes())[name]);
  }
  v1::Matrix* vectors = out->mutable_vectors();
  if (document.vectors.empty() && !document.vector_bytes.empty()) {
    vectors->set_rows(static_cast<uint32_t>(document.num_vectors()));
    vectors->set_cols(static_cast<uint32_t>(document.dim));
    vectors->set_dtype(document.dtype == VectorDtype::kFloat16 ? v1::DTYPE_FLOAT16
                                                               : v1::DTYPE_FLOAT32);
    vectors->set_data(std::move(document.vector_bytes));
  } else {
    EncodeMatrix(document.vectors.data(), document.num_vectors(), document.dim, document.dtype,
                 vectors);
  }
  for (int32_t offset : document.member_offsets) out->add_member_offsets(offset);
  for (int32_t member : document.members) out->add_members(member);
  if (document.sparse.has_value()) SparseToProto(*document.sparse, out->mutable_sparse());
}

void SearchResultToProto(const SearchResult& result, v1::SearchResponse* out) {
  for (const SearchHit& hit : result.hits) HitToProto(hit, out->add_hits());
  for (const SearchGroup& group : result.groups) {
    v1::HitGroup* g = out->add_groups();
    wire::AttributeToProto(group.value, g->mutable_value());
    for (const SearchHit& hit : group.hits) HitToProto(hit, g->add_hits());
  }
  v1::Timings* timings = out->mutable_timings();
  timings->set_candidates_ms(result.timings.candidates_ms);
  timings->set_fetch_ms(result.timings.fetch_ms);
  timings->set_rerank_ms(result.timings.rerank_ms);
  timings->set_total_ms(result.timings.total_ms);
  out->set_documents_scored(result.documents_scored);
  out->set_exhaustive(result.exhaustive);
}

void ShardSearchResultToProto(const SearchResult& result, v1::ShardSearchResponse* out) {
  SearchResultToProto(result, out->mutable_search());
  // N is at most CollectionLimits::max_num_candidates.
  out->set_num_candidates(static_cast<uint32_t>(result.num_candidates));
  out->set_documents(static_cast<uint64_t>(result.documents));
  out->set_lanes(result.lanes);
  for (const SearchHit& hit : result.dense_lane) HitToProto(hit, out->add_dense_lane());
  for (const SearchHit& hit : result.sparse_lane) HitToProto(hit, out->add_sparse_lane());
}

SearchResult SearchResultFromShardProto(v1::ShardSearchResponse* proto) {
  SearchResult result;
  v1::SearchResponse& search = *proto->mutable_search();
  for (int i = 0; i < search.hits_size(); ++i) {
    result.hits.push_back(HitFromProto(search.mutable_hits(i)));
  }
  for (int i = 0; i < search.groups_size(); ++i) {
    v1::HitGroup& g = *search.mutable_groups(i);
    SearchGroup group;
    absl::StatusOr<AttributeValue> value = wire::AttributeFromProto(g.value());
    if (value.ok()) group.value = *std::move(value);
    for (int j = 0; j < g.hits_size(); ++j) group.hits.push_back(HitFromProto(g.mutable_hits(j)));
    result.groups.push_back(std::move(group));
  }
  result.timings.candidates_ms = search.timings().candidates_ms();
  result.timings.fetch_ms = search.timings().fetch_ms();
  result.timings.rerank_ms = search.timings().rerank_ms();
  result.timings.total_ms = search.timings().total_ms();
  result.documents_scored = static_cast<int64_t>(search.documents_scored());
  result.exhaustive = search.exhaustive();
  result.num_candidates = proto->num_candidates();
  result.documents = static_cast<int64_t>(proto->documents());
  result.lanes = proto->lanes();
  for (int i = 0; i < proto->dense_lane_size(); ++i) {
    result.dense_lane.push_back(HitFromProto(proto->mutable_dense_lane(i)));
  }
  for (int i = 0; i < proto->sparse_lane_size(); ++i) {
    result.sparse_lane.push_back(HitFromProto(proto->mutable_sparse_lane(i)));
  }
  return result;
}

}  // namespace tessera::server
