// Fuzzes the .npz reader (tessera/npz.h, index/npy) with the bytes as a whole archive: the ZIP
// structure (local headers, central directory, ZIP64 records), deflate, CRC-32 checks and each
// member's .npy payload.
//
// Asserts, beyond no crash or undefined behaviour (ASan, UBSan):
// - every entry ParseNpz returns has a non-empty, unique name and a valid array;
// - round trip: SerializeNpz of the entries, stored and deflated, parses back to the same names,
//   dtypes, shapes and bytes, in the same order.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "tessera/npz.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

void CheckSameEntries(const tessera::NpzEntries& a, const tessera::NpzEntries& b,
                      const char* what) {
  FUZZ_CHECK(a.size() == b.size(), what);
  for (size_t i = 0; i < a.size(); ++i) {
    FUZZ_CHECK(a[i].first == b[i].first, what);
    FUZZ_CHECK(a[i].second.dtype == b[i].second.dtype, what);
    FUZZ_CHECK(a[i].second.shape == b[i].second.shape, what);
    FUZZ_CHECK(a[i].second.data == b[i].second.data, what);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const absl::StatusOr<NpzEntries> parsed = ParseNpz(fuzz::AsStringView(data, size));
  if (!parsed.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(parsed.status()), parsed.status().ToString());
    return 0;
  }
  std::set<std::string> names;
  for (const auto& [name, array] : *parsed) {
    FUZZ_CHECK(!name.empty(), "empty member name");
    FUZZ_CHECK(names.insert(name).second, "duplicate member name '" + name + "'");
    FUZZ_CHECK(array.Validate().ok(), array.Validate().ToString());
  }
  for (const bool compress : {false, true}) {
    const absl::StatusOr<std::string> serialized = SerializeNpz(*parsed, compress);
    FUZZ_CHECK(serialized.ok(), serialized.status().ToString());
    const absl::StatusOr<NpzEntries> reparsed = ParseNpz(*serialized);
    FUZZ_CHECK(reparsed.ok(), reparsed.status().ToString());
    CheckSameEntries(*parsed, *reparsed, "SerializeNpz round trip differs");
  }
  return 0;
}
