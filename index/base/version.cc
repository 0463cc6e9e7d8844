#include "tessera/base/version.h"

#include "absl/strings/str_cat.h"

// Both defined for this file alone by index/base/CMakeLists.txt, so that a new revision rebuilds
// nothing else.
#if !defined(TESSERA_VERSION) || !defined(TESSERA_GIT_REVISION)
#error "TESSERA_VERSION and TESSERA_GIT_REVISION come from index/base/CMakeLists.txt"
#endif

namespace tessera {

const char* Version() { return TESSERA_VERSION; }

const char* GitRevision() { return TESSERA_GIT_REVISION; }

std::string VersionString() {
  const std::string revision = GitRevision();
  return revision.empty() ? std::string(Version())
                          : absl::StrCat(Version(), " (git ", revision, ")");
}

}  // namespace tessera
