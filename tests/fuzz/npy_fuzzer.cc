// Fuzzes the .npy reader (tessera/npy.h, index/npy) with the bytes as a whole .npy file.
//
// Asserts, beyond no crash or undefined behaviour (ASan, UBSan):
// - ParseNpy and ParseNpyBuffer (the file reader's path, which reuses the buffer) agree: both fail
//   with the same code, or both return the same array;
// - an array ParseNpy returns is valid (NpyArray::Validate);
// - round trip: SerializeNpy of it parses back to the same dtype, shape and bytes;
// - ToFloat32 / ToInt64 succeed exactly for the dtypes they take, with num_elements() values.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessera/npy.h"
#include "tests/fuzz/fuzz_util.h"

namespace tessera::fuzz {
namespace {

bool IsFloat(NpyDtype dtype) {
  return dtype == NpyDtype::kFloat32 || dtype == NpyDtype::kFloat16 || dtype == NpyDtype::kFloat64;
}

void CheckSame(const NpyArray& a, const NpyArray& b, const char* what) {
  FUZZ_CHECK(a.dtype == b.dtype, what);
  FUZZ_CHECK(a.shape == b.shape, what);
  FUZZ_CHECK(a.data == b.data, what);
}

}  // namespace
}  // namespace tessera::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  using namespace tessera::fuzz;
  const absl::StatusOr<NpyArray> parsed = ParseNpy(AsStringView(data, size));
  const absl::StatusOr<NpyArray> buffered =
      internal::ParseNpyBuffer(std::vector<uint8_t>(data, data + size), "fuzz input");
  FUZZ_CHECK(parsed.status().code() == buffered.status().code(),
             parsed.status().ToString() + " vs ParseNpyBuffer " + buffered.status().ToString());
  if (!parsed.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(parsed.status()), parsed.status().ToString());
    return 0;
  }
  CheckSame(*parsed, *buffered, "ParseNpy and ParseNpyBuffer differ");
  FUZZ_CHECK(parsed->Validate().ok(), parsed->Validate().ToString());

  const absl::StatusOr<std::string> serialized = SerializeNpy(*parsed);
  FUZZ_CHECK(serialized.ok(), serialized.status().ToString());
  const absl::StatusOr<NpyArray> reparsed = ParseNpy(*serialized);
  FUZZ_CHECK(reparsed.ok(), reparsed.status().ToString());
  CheckSame(*parsed, *reparsed, "SerializeNpy round trip differs");

  const int64_t elements = parsed->num_elements();
  const absl::StatusOr<std::vector<float>> floats = parsed->ToFloat32();
  FUZZ_CHECK(floats.ok() == IsFloat(parsed->dtype), floats.status().ToString());
  if (floats.ok()) FUZZ_CHECK(static_cast<int64_t>(floats->size()) == elements, "ToFloat32 size");
  const absl::StatusOr<std::vector<int64_t>> integers = parsed->ToInt64();
  FUZZ_CHECK(integers.ok() == !IsFloat(parsed->dtype), integers.status().ToString());
  if (integers.ok()) {
    FUZZ_CHECK(static_cast<int64_t>(integers->size()) == elements, "ToInt64 size");
  }
  return 0;
}
