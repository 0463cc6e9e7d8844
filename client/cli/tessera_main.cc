// The `tessera` command: administers collections, ingests .npz files, and searches a Tessera
// server (see TesseraUsage() in commands.cc, or run `tessera --help`).
#include <iostream>
#include <string>
#include <vector>

#include "client/cli/commands.h"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  return tessera::RunTesseraCli(args, std::cout, std::cerr);
}
