// Spatial pooling of patch grids (rows, columns, tiles, row windows, global mean). See
// tessera/pooling.h.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "index/pooling/pooling_internal.h"
#include "tessera/pooling.h"
#include "tessera/status_macros.h"

namespace tessera {
namespace {

absl::Status ValidateLayout(const PatchGridLayout& layout, int64_t num_tokens) {
  if (layout.rows < 1 || layout.cols < 1 || layout.prefix_tokens < 0 || layout.suffix_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout: grid ", layout.rows, "x", layout.cols, " with prefix ", layout.prefix_tokens,
        " and suffix ", layout.suffix_tokens, ", expected rows, cols ≥ 1 and prefix, suffix ≥ 0"));
  }
  if (layout.num_tokens() != num_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout: ", layout.prefix_tokens, " prefix + ", layout.rows, "x", layout.cols,
                     " grid + ", layout.suffix_tokens, " suffix = ", layout.num_tokens(),
                     " tokens, but the document has ", num_tokens));
  }
  return absl::OkStatus();
}

absl::Status ValidateSpatialOptions(const SpatialPoolingOptions& options) {
  if (options.mode == SpatialMode::kTiles && (options.tile_rows < 1 || options.tile_cols < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tile ", options.tile_rows, "x", options.tile_cols, ", expected both ≥ 1"));
  }
  if (options.mode == SpatialMode::kRowWindows &&
      (options.window_rows < 1 || options.window_stride < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("window ", options.window_rows, " stride ",
                                                   options.window_stride, ", expected both ≥ 1"));
  }
  return absl::OkStatus();
}

// The patches of grid rectangle [row_begin, row_end) × [col_begin, col_end) as token indices.
std::vector<int32_t> Rectangle(const PatchGridLayout& layout, int64_t row_begin, int64_t row_end,
                               int64_t col_begin, int64_t col_end) {
  std::vector<int32_t> patches;
  patches.reserve((row_end - row_begin) * (col_end - col_begin));
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t c = col_begin; c < col_end; ++c) {
      patches.push_back(static_cast<int32_t>(layout.prefix_tokens + r * layout.cols + c));
    }
  }
  return patches;
}

std::vector<std::vector<int32_t>> GridGroups(const PatchGridLayout& layout,
                                             const SpatialPoolingOptions& options) {
  const int64_t rows = layout.rows, cols = layout.cols;
  std::vector<std::vector<int32_t>> groups;
  switch (options.mode) {
    case SpatialMode::kRows:
      for (int64_t r = 0; r < rows; ++r) groups.push_back(Rectangle(layout, r, r + 1, 0, cols));
      break;
    case SpatialMode::kColumns:
      for (int64_t c = 0; c < cols; ++c) groups.push_back(Rectangle(layout, 0, rows, c, c + 1));
      break;
    case SpatialMode::kTiles:
      for (int64_t r = 0; r < rows; r += options.tile_rows) {
        for (int64_t c = 0; c < cols; c += options.tile_cols) {
          groups.push_back(Rectangle(layout, r, std::min(rows, r + options.tile_rows), c,
                                     std::min(cols, c + options.tile_cols)));
        }
      }
      break;
    case SpatialMode::kRowWindows: {
      const int64_t window = std::min<int64_t>(options.window_rows, rows);
      int64_t start = 0;
      for (; start + window <= rows; start += options.window_stride) {
        groups.push_back(Rectangle(layout, start, start + window, 0, cols));
      }
      // The stride skipped past the last rows: add a window that ends at the final row.
      if (start - options.window_stride + window < rows) {
        groups.push_back(Rectangle(layout, rows - window, rows, 0, cols));
      }
      break;
    }
    case SpatialMode::kGlobal:
      groups.push_back(Rectangle(layout, 0, rows, 0, cols));
      break;
  }
  return groups;
}

}  // namespace

absl::StatusOr<PooledMatrix> PoolPatchGrid(FloatMatrixView tokens, const PatchGridLayout& layout,
                                           const SpatialPoolingOptions& options) {
  TESSERA_RETURN_IF_ERROR(internal::ValidateTokenMatrix(tokens));
  TESSERA_RETURN_IF_ERROR(ValidateLayout(layout, tokens.rows));
  TESSERA_RETURN_IF_ERROR(ValidateSpatialOptions(options));
  std::vector<std::vector<int32_t>> groups;
  if (options.keep_special_tokens) {
    for (int64_t i = 0; i < layout.prefix_tokens; ++i) groups.push_back({static_cast<int32_t>(i)});
  }
  const size_t first_grid_group = groups.size();
  for (std::vector<int32_t>& group : GridGroups(layout, options))
    groups.push_back(std::move(group));
  const size_t end_grid_group = groups.size();
  if (options.keep_special_tokens) {
    for (int64_t i = layout.num_tokens() - layout.suffix_tokens; i < layout.num_tokens(); ++i) {
      groups.push_back({static_cast<int32_t>(i)});
    }
  }
  // Special tokens are kept as they are; renormalisation applies to the grid means only.
  std::vector<bool> renormalize(groups.size(), false);
  std::fill(renormalize.begin() + first_grid_group, renormalize.begin() + end_grid_group,
            options.renormalize);
  return internal::MeanOfGroups(tokens, groups, renormalize);
}

absl::Status ParseSpatialMode(const std::string& spec, SpatialPoolingOptions* options) {
  const std::vector<std::string> parts = absl::StrSplit(spec, ':');
  auto invalid = [&spec]() {
    return absl::InvalidArgumentError(absl::StrCat(
        "spatial mode '", spec, "', expected rows, cols, tile:AxB, window:W:S or global"));
  };
  if (parts.size() == 1 && parts[0] == "rows") {
    options->mode = SpatialMode::kRows;
  } else if (parts.size() == 1 && parts[0] == "cols") {
    options->mode = SpatialMode::kColumns;
  } else if (parts.size() == 1 && parts[0] == "global") {
    options->mode = SpatialMode::kGlobal;
  } else if (parts.size() == 2 && parts[0] == "tile") {
    const std::vector<std::string> sizes = absl::StrSplit(parts[1], 'x');
    if (sizes.size() != 2 || !absl::SimpleAtoi(sizes[0], &options->tile_rows) ||
        !absl::SimpleAtoi(sizes[1], &options->tile_cols)) {
      return invalid();
    }
    options->mode = SpatialMode::kTiles;
  } else if (parts.size() == 3 && parts[0] == "window") {
    if (!absl::SimpleAtoi(parts[1], &options->window_rows) ||
        !absl::SimpleAtoi(parts[2], &options->window_stride)) {
      return invalid();
    }
    options->mode = SpatialMode::kRowWindows;
  } else {
    return invalid();
  }
  return ValidateSpatialOptions(*options);
}

}  // namespace tessera
