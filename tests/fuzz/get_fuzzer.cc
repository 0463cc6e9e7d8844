// Fuzzes Get as the server runs it: the bytes as a tessera.v1.GetRequest (bytes protobuf cannot
// parse are skipped) sent to the standalone server's backend (EngineBackend::Get: the collection,
// Collection::Get with GetOptions::stored_bytes and StoredDocumentToProto) over the fixture engine
// (engine_fixture.h).
//
// Asserts, beyond no crash or undefined behaviour (ASan, UBSan):
// - a failed Get is NOT_FOUND or INVALID_ARGUMENT, and only seed ids are found;
// - the response carries the id asked for and a vectors matrix that DecodeMatrix accepts with the
//   collection's dim, holding the same values as Get without stored_bytes (fp32 decoded);
// - member_offsets has one entry per vector plus one, ascending from 0 to the member count, and
//   every member is a token of the document.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/convert.h"
#include "tests/fuzz/engine_fixture.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  using namespace tessera::fuzz;
  v1::GetRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;

  // What the Get handler runs once the request is admitted and names a collection.
  v1::GetResponse response;
  const absl::Status got = FixtureBackend().Get(request, &response);
  if (!got.ok()) {
    FUZZ_CHECK(absl::IsNotFound(got) || absl::IsInvalidArgument(got), got.ToString());
    // Any name has seed-like ids ("<name>-0"); only a fixture collection holds them.
    FUZZ_CHECK(
        !FindCollection(request.collection()).ok() || !IsSeedId(request.collection(), request.id()),
        "a seed document is missing");
    return 0;
  }
  FUZZ_CHECK(IsSeedId(request.collection(), request.id()), "found a document never written");
  absl::StatusOr<std::shared_ptr<Collection>> collection = FindCollection(request.collection());
  FUZZ_CHECK(collection.ok(), collection.status().ToString());

  FUZZ_CHECK(response.id() == request.id(), "response id");
  const int64_t dim = (*collection)->schema().dim;
  const absl::StatusOr<std::vector<float>> vectors =
      server::DecodeMatrix(response.vectors(), dim, "vectors");
  FUZZ_CHECK(vectors.ok(), vectors.status().ToString());
  const absl::StatusOr<StoredDocument> decoded = (*collection)->Get(request.id());
  FUZZ_CHECK(decoded.ok(), decoded.status().ToString());
  FUZZ_CHECK(decoded->vectors.size() == vectors->size() &&
                 std::memcmp(decoded->vectors.data(), vectors->data(),
                             vectors->size() * sizeof(float)) == 0,
             "stored bytes and fp32 vectors differ");
  const int64_t num_vectors = response.vectors().rows();
  FUZZ_CHECK(response.member_offsets_size() == num_vectors + 1, "member_offsets size");
  FUZZ_CHECK(response.member_offsets(0) == 0 &&
                 static_cast<int>(response.member_offsets(num_vectors)) == response.members_size(),
             "member_offsets bounds");
  for (int64_t v = 0; v < num_vectors; ++v) {
    FUZZ_CHECK(response.member_offsets(v) <= response.member_offsets(v + 1),
               absl::StrCat("member_offsets not ascending at ", v));
  }
  for (uint32_t member : response.members()) {
    FUZZ_CHECK(member < response.num_tokens(), absl::StrCat("member ", member));
  }
  return 0;
}
