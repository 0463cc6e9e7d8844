// The `tessera` command: administers collections, ingests .npz files, and searches a Tessera
// server (see TesseraUsage() in commands.cc, or run `tessera --help`).
#include <grpc/support/log.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "client/cli/commands.h"

namespace {
// gRPC's own log lines (a failed TLS handshake, a refused connection) repeat what the command
// reports as "tessera: CODE: message"; they are shown only when GRPC_VERBOSITY asks for them.
void DiscardGrpcLog(gpr_log_func_args*) {}
}  // namespace

int main(int argc, char** argv) {
  if (std::getenv("GRPC_VERBOSITY") == nullptr) gpr_set_log_function(DiscardGrpcLog);
  const std::vector<std::string> args(argv + 1, argv + argc);
  return tessera::client::RunTesseraCli(args, std::cout, std::cerr);
}
