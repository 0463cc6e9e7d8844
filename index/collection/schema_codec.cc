#include "index/collection/schema_codec.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace tessera::internal {
namespace {

const char* MethodName(PoolingMethod method) {
  return method == PoolingMethod::kWard ? "ward" : "reference";
}

const char* SpatialModeName(SpatialMode mode) {
  switch (mode) {
    case SpatialMode::kRows:
      return "rows";
    case SpatialMode::kColumns:
      return "cols";
    case SpatialMode::kTiles:
      return "tiles";
    case SpatialMode::kRowWindows:
      return "windows";
    case SpatialMode::kGlobal:
      return "global";
  }
  return "rows";
}

absl::Status Corrupt(const std::string& line) {
  return absl::DataLossError(absl::StrCat("collection schema: cannot decode line '", line, "'"));
}

bool ParseBool(const std::string& text, bool* value) {
  if (text != "0" && text != "1") return false;
  *value = text == "1";
  return true;
}

}  // namespace

std::string EncodeSchema(const CollectionSchema& schema) {
  std::string out = absl::StrCat(kSchemaFormatLine, "\n");
  absl::StrAppend(&out, "name ", schema.name, "\n", "dim ", schema.dim, "\n", "dtype ",
                  schema.dtype == VectorDtype::kFloat16 ? "fp16" : "fp32", "\n", "shards ",
                  schema.num_shards, "\n");
  if (schema.pooling.hierarchical.has_value()) {
    const TokenPoolingOptions& h = *schema.pooling.hierarchical;
    absl::StrAppend(&out, "hierarchical ", h.pool_factor, " ", MethodName(h.method), " ",
                    h.protected_tokens, " ", h.renormalize ? 1 : 0, " ", h.min_vectors, " ",
                    absl::StrFormat("%.17g", h.max_merge_height), "\n");
  }
  if (schema.pooling.spatial.has_value()) {
    const SpatialPoolingOptions& s = *schema.pooling.spatial;
    absl::StrAppend(&out, "spatial ", SpatialModeName(s.mode), " ", s.tile_rows, " ", s.tile_cols,
                    " ", s.window_rows, " ", s.window_stride, " ", s.keep_special_tokens ? 1 : 0,
                    " ", s.renormalize ? 1 : 0, "\n");
  }
  absl::StrAppend(&out, "candidates ",
                  schema.candidates.kind == CandidateSpec::Kind::kPooled ? "pooled" : "global", " ",
                  schema.candidates.pool_factor, " ", schema.candidates.factory, "\n");
  absl::StrAppend(&out, "centroid ", schema.candidates.residual_bits, " ",
                  schema.candidates.centroid_min_vectors, " ",
                  schema.candidates.centroid_min_training_vectors, " ",
                  schema.candidates.rerank_from_codes ? 1 : 0, "\n");
  // Only with a sparse field: a schema without one encodes as it did before sparse fields.
  if (schema.sparse.has_value()) {
    absl::StrAppend(&out, "sparse ", schema.sparse->idf ? 1 : 0, " ",
                    absl::StrFormat("%.17g", schema.sparse->k1), " ",
                    absl::StrFormat("%.17g", schema.sparse->b), "\n");
  }
  for (const auto& [field, type] : schema.attributes) {
    absl::StrAppend(&out, "attribute ", field, " ", AttributeTypeName(type), "\n");
  }
  return out;
}

absl::StatusOr<CollectionSchema> DecodeSchema(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  if (lines.empty() || lines[0] != kSchemaFormatLine) {
    return absl::DataLossError(
        absl::StrCat("collection schema: expected '", kSchemaFormatLine, "' as the first line"));
  }
  CollectionSchema schema;
  schema.pooling = PoolingSpec{};
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> f = absl::StrSplit(lines[i], ' ');
    const std::string& key = f[0];
    bool ok = true;
    if (key == "name" && f.size() == 2) {
      schema.name = f[1];
    } else if (key == "dim" && f.size() == 2) {
      ok = absl::SimpleAtoi(f[1], &schema.dim);
    } else if (key == "dtype" && f.size() == 2 && (f[1] == "fp16" || f[1] == "fp32")) {
      schema.dtype = f[1] == "fp16" ? VectorDtype::kFloat16 : VectorDtype::kFloat32;
    } else if (key == "shards" && f.size() == 2) {
      ok = absl::SimpleAtoi(f[1], &schema.num_shards);
    } else if (key == "hierarchical" && f.size() >= 5 && f.size() <= 7) {
      // Schemas written before min_vectors existed have five fields (no floor), those before
      // max_merge_height six (no limit): they keep pooling as they did.
      TokenPoolingOptions h;
      auto method = ParsePoolingMethod(f[2]);
      ok = absl::SimpleAtoi(f[1], &h.pool_factor) && method.ok() &&
           absl::SimpleAtoi(f[3], &h.protected_tokens) && ParseBool(f[4], &h.renormalize) &&
           (f.size() < 6 || absl::SimpleAtoi(f[5], &h.min_vectors)) &&
           (f.size() < 7 || absl::SimpleAtod(f[6], &h.max_merge_height));
      if (ok) h.method = *method;
      schema.pooling.hierarchical = h;
    } else if (key == "spatial" && f.size() == 8) {
      SpatialPoolingOptions s;
      const std::string& mode = f[1];
      if (mode == "rows") {
        s.mode = SpatialMode::kRows;
      } else if (mode == "cols") {
        s.mode = SpatialMode::kColumns;
      } else if (mode == "tiles") {
        s.mode = SpatialMode::kTiles;
      } else if (mode == "windows") {
        s.mode = SpatialMode::kRowWindows;
      } else if (mode == "global") {
        s.mode = SpatialMode::kGlobal;
      } else {
        ok = false;
      }
      ok = ok && absl::SimpleAtoi(f[2], &s.tile_rows) && absl::SimpleAtoi(f[3], &s.tile_cols) &&
           absl::SimpleAtoi(f[4], &s.window_rows) && absl::SimpleAtoi(f[5], &s.window_stride) &&
           ParseBool(f[6], &s.keep_special_tokens) && ParseBool(f[7], &s.renormalize);
      schema.pooling.spatial = s;
    } else if (key == "candidates" && f.size() == 4 && (f[1] == "pooled" || f[1] == "global")) {
      schema.candidates.kind =
          f[1] == "pooled" ? CandidateSpec::Kind::kPooled : CandidateSpec::Kind::kGlobalMean;
      ok = absl::SimpleAtoi(f[2], &schema.candidates.pool_factor);
      schema.candidates.factory = f[3];
    } else if (key == "centroid" && (f.size() == 4 || f.size() == 5)) {
      // Absent in schemas written before the centroid index: they take the defaults; the fifth
      // field (rerank_from_codes) is newer still.
      ok = absl::SimpleAtoi(f[1], &schema.candidates.residual_bits) &&
           absl::SimpleAtoi(f[2], &schema.candidates.centroid_min_vectors) &&
           absl::SimpleAtoi(f[3], &schema.candidates.centroid_min_training_vectors) &&
           (f.size() == 4 || ParseBool(f[4], &schema.candidates.rerank_from_codes));
    } else if (key == "sparse" && f.size() == 4) {
      SparseScoring sparse;
      ok = ParseBool(f[1], &sparse.idf) && absl::SimpleAtod(f[2], &sparse.k1) &&
           absl::SimpleAtod(f[3], &sparse.b);
      schema.sparse = sparse;
    } else if (key == "attribute" && f.size() == 3) {
      if (f[2] == "int64") {
        schema.attributes[f[1]] = AttributeType::kInt64;
      } else if (f[2] == "double") {
        schema.attributes[f[1]] = AttributeType::kDouble;
      } else if (f[2] == "string") {
        schema.attributes[f[1]] = AttributeType::kString;
      } else {
        ok = false;
      }
    } else {
      ok = false;
    }
    if (!ok) return Corrupt(lines[i]);
  }
  return schema;
}

}  // namespace tessera::internal
