// LLVMFuzzerInitialize of the targets that parse protobuf messages (SRCS of their
// tessera_fuzz_target): protobuf logs every string field that is not UTF-8, and a fuzzer sends
// thousands.
#include "google/protobuf/stubs/logging.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}
