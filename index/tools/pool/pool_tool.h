// The `tessera-pool` command: pools the token matrices of a NumPy file offline, as ingestion
// would, and writes the pooled matrices and each token's cluster label to an .npz.
#ifndef TESSERA_INDEX_TOOLS_POOL_POOL_TOOL_H_
#define TESSERA_INDEX_TOOLS_POOL_POOL_TOOL_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tessera/pooling.h"

namespace tessera {

struct PoolToolConfig {
  std::string input_path;   // .npy (one document) or .npz (one 2-D array per document)
  std::string output_path;  // .npz
  std::optional<PatchGridLayout> layout;
  PoolingSpec spec;
  int threads = 0;  // 0 = all hardware threads
};

// Parses the command line (argv[0] is the program name). INVALID_ARGUMENT with a message that names
// the flag for anything malformed; the usage text is UsageText().
absl::StatusOr<PoolToolConfig> ParsePoolToolArgs(const std::vector<std::string>& args);
std::string UsageText();

// Runs the tool. For each input array KEY (for an .npy, the file's stem) the output holds KEY (the
// pooled float32 matrix) and KEY.labels (int32, one per input token: its pooled vector, or -1).
// Documents are pooled in parallel; the output order follows the input.
absl::Status RunPoolTool(const PoolToolConfig& config);

}  // namespace tessera

#endif  // TESSERA_INDEX_TOOLS_POOL_POOL_TOOL_H_
