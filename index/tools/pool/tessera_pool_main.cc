// tessera-pool: offline token pooling of NumPy files. See pool_tool.h and `tessera-pool --help`.
#include <iostream>
#include <string>
#include <vector>

#include "index/tools/pool/pool_tool.h"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv, argv + argc);
  for (const std::string& arg : args) {
    if (arg == "--help" || arg == "-h") {
      std::cout << tessera::UsageText();
      return 0;
    }
  }
  const auto config = tessera::ParsePoolToolArgs(args);
  if (!config.ok()) {
    std::cerr << "tessera-pool: " << config.status().message() << "\n\n" << tessera::UsageText();
    return 2;
  }
  const absl::Status status = tessera::RunPoolTool(*config);
  if (!status.ok()) {
    std::cerr << "tessera-pool: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
