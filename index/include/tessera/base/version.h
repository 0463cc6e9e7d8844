// The version of this build, for `--version` and the tessera_build_info metric.
#ifndef TESSERA_BASE_VERSION_H_
#define TESSERA_BASE_VERSION_H_

#include <string>

namespace tessera {

// The project's version (CMake's PROJECT_VERSION), e.g. "0.1.0".
const char* Version();

// `git describe --always --dirty --tags` of the source tree when the build was configured
// (e.g. "7291f1c" or "7291f1c-dirty"); "" when it was not a git checkout. Set at configure time,
// so a commit made since without configuring again is not reflected.
const char* GitRevision();

// Version() and, when known, GitRevision(): "0.1.0 (git 7291f1c)" or "0.1.0".
std::string VersionString();

}  // namespace tessera

#endif  // TESSERA_BASE_VERSION_H_
