// Reading and writing NumPy's .npz archives: a ZIP file whose members `NAME.npy` each hold one
// array, as numpy.savez (stored) and numpy.savez_compressed (deflated) write them. The ZIP format
// itself (central directory, ZIP64, which NumPy uses for large members, deflate, CRC-32) is
// libzip's; the writer produces archives that numpy.load and Python's zipfile read, ZIP64 where a
// member, an offset or the member count needs it.
//
// Reading a buffer needs the arrays' size on top of it; reading a file reads it in place, member
// by member. Reading checks the sizes an archive declares (central directory, local headers, each
// .npy header's shape × dtype) against each other and against NpzLimits before it inflates
// anything, so a "zip bomb" is refused from its headers. Writing streams each member from its
// array. Thread-compatible.
#ifndef TESSERA_NPZ_H_
#define TESSERA_NPZ_H_

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tessera/npy.h"

namespace tessera {

// The (name, array) entries of an archive, in archive order. A name is the member name without
// its ".npy" suffix, which is also numpy.load's key for it.
using NpzEntries = std::vector<std::pair<std::string, NpyArray>>;

// Bounds on what reading an archive may produce, checked against the sizes the archive declares
// before a member is inflated or copied.
struct NpzLimits {
  // The most bytes of data (product(shape) × itemsize) of one array.
  uint64_t max_array_bytes = std::numeric_limits<uint64_t>::max();
  // The most bytes all members may declare together (.npy headers and data, uncompressed).
  uint64_t max_total_bytes = std::numeric_limits<uint64_t>::max();
  // Where each limit comes from, added to the message that reports it (empty: nothing added).
  std::string array_limit_hint;
  std::string total_limit_hint;
};

// Parses a whole .npz archive. Every member must be a stored or deflated `NAME.npy` (a member with
// another name, another compression method, encryption, a bad CRC-32, a duplicate name or a bad
// .npy payload is INVALID_ARGUMENT, as is any damage to the ZIP structure); `source` names the
// archive in messages. Before any member is inflated, all members' declared sizes must agree
// (local header and central directory) and fit `limits.max_total_bytes`; before a member's data
// is inflated past its .npy header, the header's shape × dtype must account for exactly the
// member's declared size and fit `limits.max_array_bytes`; inflation stops at the declared size.
// A violation is INVALID_ARGUMENT naming the member, the sizes and the limit.
absl::StatusOr<NpzEntries> ParseNpz(absl::string_view bytes,
                                    absl::string_view source = "npz buffer",
                                    const NpzLimits& limits = {});

// The archive bytes for `arrays`: member `NAME.npy` for each entry, in order, deflated if
// `compress` (zlib's default level, as numpy.savez_compressed), else stored (as numpy.savez).
// INVALID_ARGUMENT for an empty or duplicate name, a name over 65531 bytes, or an invalid array.
absl::StatusOr<std::string> SerializeNpz(const NpzEntries& arrays, bool compress = false);

// Reads the file and parses it as ParseNpz does, with the path in messages. NOT_FOUND if it does
// not exist; other I/O errors as ReadNpyFile.
absl::StatusOr<NpzEntries> ReadNpzFile(const std::string& path, const NpzLimits& limits = {});

// Writes `arrays` as SerializeNpz does, streaming each member from its array into a temporary
// file that replaces `path` when it is complete. Errors as SerializeNpz and WriteNpyFile; a failed
// write leaves no file behind.
absl::Status WriteNpzFile(const std::string& path, const NpzEntries& arrays, bool compress = false);

namespace internal {

// What reading an archive cost, for tests: bytes inflate produced, and the largest buffer a
// deflated member was inflated into.
struct NpzReadStats {
  uint64_t inflated_bytes = 0;
  uint64_t largest_buffer_bytes = 0;
};

// ParseNpz, adding to `stats` (may be null) what it inflated.
absl::StatusOr<NpzEntries> ParseNpzForTesting(absl::string_view bytes, absl::string_view source,
                                              const NpzLimits& limits, NpzReadStats* stats);

}  // namespace internal
}  // namespace tessera

#endif  // TESSERA_NPZ_H_
