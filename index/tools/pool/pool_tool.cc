#include "index/tools/pool/pool_tool.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "index/common/thread_pool.h"
#include "tessera/npy.h"
#include "tessera/npz.h"
#include "tessera/status_macros.h"

namespace tessera {
namespace {

absl::StatusOr<int> ParseInt(const std::string& flag, const std::string& value, int min) {
  int parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed) || parsed < min) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " '", value, "', expected an integer ≥ ", min));
  }
  return parsed;
}

absl::StatusOr<double> ParseHeight(const std::string& flag, const std::string& value) {
  double parsed = 0.0;
  if (!absl::SimpleAtod(value, &parsed) || !(parsed >= 0.0 && std::isfinite(parsed))) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " '", value, "', expected a finite number ≥ 0 (0: no limit)"));
  }
  return parsed;
}

absl::Status ParseGrid(const std::string& value, PatchGridLayout* layout) {
  const std::vector<std::string> parts = absl::StrSplit(value, 'x');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &layout->rows) ||
      !absl::SimpleAtoi(parts[1], &layout->cols) || layout->rows < 1 || layout->cols < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grid '", value, "', expected ROWSxCOLS with both ≥ 1, e.g. 32x32"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string UsageText() {
  return R"(usage: tessera-pool --input X.npz|X.npy --output Y.npz [options]

Pools each document's token matrix (one 2-D float32/float16 array per document; the .npz key is the
document id) and writes, per KEY, the pooled float32 matrix under KEY and the int32 label of every
input token (its pooled vector, or -1 if dropped) under KEY.labels.

hierarchical pooling:
  --pool-factor P     keep max(floor(n/P), 1) clusters (default 2; 1 without --spatial unless given)
  --method M          ward (Ward on cosine distances, default) | reference (ColBERT/PyLate recipe)
  --min-vectors M     but at least min(n, M) clusters (default 0: no floor)
  --max-merge-height H  and no merge above Ward height H: more clusters where tokens are far
                      apart (default 0.3 for ward, as collections pool; 0: no limit, the n/P rule)
  --protect K         keep the first K tokens unpooled (default 0)
  --renormalize       L2-normalise the pooled means
spatial pooling of patch grids:
  --grid RxC          the document holds [prefix] + R×C patches (row-major) + [suffix]
  --prefix K          special tokens before the grid (default 0)
  --suffix K          special tokens after the grid (default 0)
  --keep-special      keep prefix/suffix tokens as vectors instead of dropping them
  --spatial MODE      rows | cols | tile:AxB | window:W:S | global (needs --grid)
other:
  --threads N         documents pooled in parallel (default: all cores)
)";
}

absl::StatusOr<PoolToolConfig> ParsePoolToolArgs(const std::vector<std::string>& args) {
  PoolToolConfig config;
  TokenPoolingOptions hierarchical;
  SpatialPoolingOptions spatial;
  PatchGridLayout layout;
  bool has_grid = false, has_spatial = false, has_pool_factor = false;
  std::optional<double> max_merge_height;  // default: DefaultMaxMergeHeight(method)
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& flag = args[i];
    auto value = [&]() -> absl::StatusOr<std::string> {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat(flag, " needs a value"));
      }
      return args[++i];
    };
    if (flag == "--input") {
      TESSERA_ASSIGN_OR_RETURN(config.input_path, value());
    } else if (flag == "--output") {
      TESSERA_ASSIGN_OR_RETURN(config.output_path, value());
    } else if (flag == "--pool-factor") {
      TESSERA_ASSIGN_OR_RETURN(const std::string v, value());
      TESSERA_ASSIGN_OR_RETURN(hierarchical.pool_factor, ParseInt(flag, v, 1));
      has_pool_factor = true;
    } else if (flag == "--method") {
      TESSERA_ASSIGN_OR_RETURN(const std::string v, value());
      TESSERA_ASSIGN_OR_RETURN(hierarchical.method, ParsePoolingMethod(v));
    } else if (flag == "--min-vectors") {
      TESSERA_ASSIGN_OR_RETURN(const std::string v, value());
      TESSERA_ASSIGN_OR_RETURN(hierarchical.min_vectors, ParseInt(flag, v, 0));
    } else if (flag == "--max-merge-height") {
      TESSERA_ASSIGN_OR_RETURN(const std::string v, value());
      TESSERA_ASSIGN_OR_RETURN(max_merge_height, ParseHeight(flag, v));
    } else if (flag == "--protect") {
      TESSERA_ASSIGN_OR_RETURN(const std::string v, value());
      TESSERA_ASSIGN_OR_RETURN(hierarchical.protected_tokens, ParseInt(flag, v, 0));
    } else if (flag == "--renormalize") {
      hierarchical.renormalize = true;
      spatial.renormalize = true;
    } else if (flag == "--grid") {
      TESSERA_ASSIGN_OR_RETURN(const std::string v, value());
      TESSERA_RETURN_IF_ERROR(ParseGrid(v, &layout));
      has_grid = true;
    } else if (flag == "--prefix" || flag == "--suffix") {
      TESSERA_ASSIGN_OR_RETURN(const std::string v, value());
      TESSERA_ASSIGN_OR_RETURN(const int count, ParseInt(flag, v, 0));
      (flag == "--prefix" ? layout.prefix_tokens : layout.suffix_tokens) = count;
    } else if (flag == "--keep-special") {
      spatial.keep_special_tokens = true;
    } else if (flag == "--spatial") {
      TESSERA_ASSIGN_OR_RETURN(const std::string v, value());
      TESSERA_RETURN_IF_ERROR(ParseSpatialMode(v, &spatial));
      has_spatial = true;
    } else if (flag == "--threads") {
      TESSERA_ASSIGN_OR_RETURN(const std::string v, value());
      TESSERA_ASSIGN_OR_RETURN(config.threads, ParseInt(flag, v, 0));
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown argument '", flag, "'"));
    }
  }
  if (config.input_path.empty()) return absl::InvalidArgumentError("--input is required");
  if (config.output_path.empty()) return absl::InvalidArgumentError("--output is required");
  if (has_spatial && !has_grid) return absl::InvalidArgumentError("--spatial needs --grid RxC");
  if (has_grid) config.layout = layout;
  if (has_spatial) config.spec.spatial = spatial;
  // Without spatial pooling, hierarchical pooling is the point (default factor 2); with it, only
  // when a factor above 1 is given.
  if (!has_spatial || (has_pool_factor && hierarchical.pool_factor > 1)) {
    hierarchical.max_merge_height =
        max_merge_height.value_or(DefaultMaxMergeHeight(hierarchical.method));
    config.spec.hierarchical = hierarchical;
  }
  return config;
}

absl::Status RunPoolTool(const PoolToolConfig& config) {
  std::vector<std::pair<std::string, NpyArray>> inputs;
  if (absl::EndsWith(config.input_path, ".npy")) {
    TESSERA_ASSIGN_OR_RETURN(NpyArray array, ReadNpyFile(config.input_path));
    inputs.emplace_back(std::filesystem::path(config.input_path).stem().string(), std::move(array));
  } else {
    TESSERA_ASSIGN_OR_RETURN(inputs, ReadNpzFile(config.input_path));
  }
  std::vector<absl::StatusOr<PooledMatrix>> results(inputs.size(),
                                                    absl::UnknownError("not pooled"));
  internal::ThreadPool pool(config.threads);
  pool.ParallelFor(static_cast<int64_t>(inputs.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t d = begin; d < end; ++d) {
      const NpyArray& array = inputs[d].second;
      if (array.shape.size() != 2) {
        results[d] = absl::InvalidArgumentError(absl::StrCat(
            "shape has ", array.shape.size(), " dimensions, expected a 2-D tokens × dim matrix"));
        continue;
      }
      absl::StatusOr<std::vector<float>> tokens = array.ToFloat32();
      if (!tokens.ok()) {
        results[d] = tokens.status();
        continue;
      }
      const FloatMatrixView view{tokens->data(), array.shape[0], array.shape[1]};
      results[d] = PoolDocument(view, config.layout, config.spec);
    }
  });
  std::vector<std::pair<std::string, NpyArray>> outputs;
  outputs.reserve(2 * inputs.size());
  for (size_t d = 0; d < inputs.size(); ++d) {
    const std::string& key = inputs[d].first;
    if (!results[d].ok()) {
      return absl::Status(results[d].status().code(),
                          absl::StrCat("document '", key, "': ", results[d].status().message()));
    }
    const PooledMatrix& pooled = *results[d];
    outputs.emplace_back(
        key, NpyArray::FromFloat32(pooled.num_vectors(), pooled.dim, pooled.vectors.data()));
    outputs.emplace_back(absl::StrCat(key, ".labels"), NpyArray::FromInt32(pooled.labels));
  }
  return WriteNpzFile(config.output_path, outputs);
}

}  // namespace tessera
