// Fuzzes Upsert as the server runs it: the bytes as one tessera.v1.UpsertRequest message of the
// stream (bytes protobuf cannot parse are skipped, as gRPC would reject them) sent to the
// standalone server's backend (EngineBackend::Upsert: the collection, the per-message document
// limit, DocumentFromProto for each document — DecodeMatrix, layout, attributes —
// Collection::Upsert and one result per document) over the fixture engine (engine_fixture.h), which
// validates, pools and stores the documents.
//
// Asserts, beyond no crash or undefined behaviour (ASan, UBSan):
// - DecodeMatrix of each document's tokens with no expected dim accepts exactly the packed sizes
//   of the known dtypes and returns rows × cols values; re-encoded (EncodeMatrix) in their dtype
//   they give back the bytes sent (a NaN may come back quieted);
// - DocumentFromProto keeps the id, shape and attributes it was given, and a document it refuses
//   comes back INVALID_ARGUMENT with its message;
// - a refused message is NOT_FOUND (collection) or RESOURCE_EXHAUSTED (too many documents);
// - one result per document, with its id; an accepted document reads back (Collection::Get) with
//   the version and vector count of its result, and the token count and attributes it was sent.
// Accepted documents that are not seeds are deleted again, so that the collections stay small, and
// every 4096th input flushes its collection (Collection::Snapshot, as the Flush RPC does).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/convert.h"
#include "tessera/float16.h"
#include "tests/fuzz/engine_fixture.h"
#include "tests/fuzz/fuzz_util.h"

namespace tessera::fuzz {
namespace {

bool SameAttributes(const Attributes& a, const Attributes& b) {
  if (a.size() != b.size()) return false;
  for (auto i = a.begin(), j = b.begin(); i != a.end(); ++i, ++j) {
    if (i->first != j->first || !SameBits(i->second, j->second)) return false;
  }
  return true;
}

// DecodeMatrix with no expected dim, and its round trip through EncodeMatrix.
void CheckMatrixRoundTrip(const v1::Matrix& matrix) {
  const absl::StatusOr<std::vector<float>> values = server::DecodeMatrix(matrix, 0, "tokens");
  const size_t itemsize = matrix.dtype() == v1::DTYPE_FLOAT32   ? 4
                          : matrix.dtype() == v1::DTYPE_FLOAT16 ? 2
                                                                : 0;
  const unsigned __int128 expected =
      static_cast<unsigned __int128>(matrix.rows()) * matrix.cols() * itemsize;
  FUZZ_CHECK(
      values.ok() == (itemsize != 0 && expected == matrix.data().size()),
      absl::StrCat("DecodeMatrix ", matrix.rows(), " × ", matrix.cols(), " dtype ", matrix.dtype(),
                   " with ", matrix.data().size(), " bytes: ", values.status().ToString()));
  if (!values.ok()) return;
  FUZZ_CHECK(values->size() == static_cast<size_t>(matrix.rows()) * matrix.cols(),
             "DecodeMatrix value count");
  v1::Matrix encoded;
  server::EncodeMatrix(values->data(), matrix.rows(), matrix.cols(),
                       itemsize == 4 ? VectorDtype::kFloat32 : VectorDtype::kFloat16, &encoded);
  FUZZ_CHECK(encoded.rows() == matrix.rows() && encoded.cols() == matrix.cols() &&
                 encoded.dtype() == matrix.dtype() && encoded.data().size() == matrix.data().size(),
             "EncodeMatrix shape");
  if (encoded.data() == matrix.data()) return;
  // Only NaNs may differ (fp16 → fp32 → fp16 may quiet a signalling NaN).
  FUZZ_CHECK(itemsize == 2, "fp32 matrix bytes changed in the round trip");
  for (size_t i = 0; i < values->size(); ++i) {
    if (std::memcmp(encoded.data().data() + 2 * i, matrix.data().data() + 2 * i, 2) != 0) {
      FUZZ_CHECK(std::isnan((*values)[i]), absl::StrCat("fp16 value ", i, " changed"));
    }
  }
}

}  // namespace
}  // namespace tessera::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  using namespace tessera::fuzz;
  v1::UpsertRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  for (const v1::Document& document : request.documents()) CheckMatrixRoundTrip(document.tokens());

  // What the Upsert handler runs for each message of a stream that names a collection.
  v1::UpsertResponse response;
  const absl::Status upserted = FixtureBackend().Upsert(request, &response);
  if (!upserted.ok()) {
    FUZZ_CHECK(absl::IsNotFound(upserted) || absl::IsResourceExhausted(upserted),
               upserted.ToString());
    return 0;
  }
  FUZZ_CHECK(response.results_size() == request.documents_size(), "one result per document");

  absl::StatusOr<std::shared_ptr<Collection>> collection = FindCollection(request.collection());
  FUZZ_CHECK(collection.ok(), collection.status().ToString());
  const int64_t dim = (*collection)->schema().dim;
  // The last accepted write of each id is the one that reads back: its index and its decoding.
  std::map<std::string, std::pair<int, Document>> last;
  for (int i = 0; i < request.documents_size(); ++i) {
    const v1::Document& proto = request.documents(i);
    const v1::DocumentResult& result = response.results(i);
    FUZZ_CHECK(result.id() == proto.id(), absl::StrCat("result ", i, " names another id"));
    absl::StatusOr<Document> document = server::DocumentFromProto(proto, dim, i);
    if (!document.ok()) {
      FUZZ_CHECK(absl::IsInvalidArgument(document.status()), document.status().ToString());
      FUZZ_CHECK(result.code() == static_cast<int>(absl::StatusCode::kInvalidArgument) &&
                     result.message() == document.status().message(),
                 absl::StrCat("result ", i, " of a refused document: ", result.code(), " ",
                              result.message()));
      continue;
    }
    FUZZ_CHECK(document->id == proto.id() && document->num_tokens == proto.tokens().rows() &&
                   document->dim == dim &&
                   static_cast<int64_t>(document->tokens.size()) == document->num_tokens * dim &&
                   document->layout.has_value() == proto.has_layout() &&
                   static_cast<int>(document->attributes.size()) == proto.attributes_size(),
               "DocumentFromProto changed the document");
    if (result.code() == 0) last.insert_or_assign(proto.id(), std::pair{i, *std::move(document)});
  }
  std::vector<std::string> written;
  for (const auto& [id, accepted] : last) {
    const auto& [i, sent] = accepted;
    const v1::DocumentResult& result = response.results(i);
    const absl::StatusOr<StoredDocument> stored = (*collection)->Get(id);
    FUZZ_CHECK(stored.ok(), absl::StrCat("Get after Upsert: ", stored.status().ToString()));
    FUZZ_CHECK(stored->version == result.version(), "version");
    FUZZ_CHECK(stored->num_tokens == sent.num_tokens, "num_tokens");
    FUZZ_CHECK(stored->num_vectors() == result.num_vectors(), "num_vectors");
    FUZZ_CHECK(SameAttributes(stored->attributes, sent.attributes), "attributes");
    if (!IsSeedId(request.collection(), id)) written.push_back(id);
  }
  if (!written.empty()) {
    const absl::StatusOr<std::vector<bool>> deleted = (*collection)->Delete(written);
    FUZZ_CHECK(deleted.ok(), deleted.status().ToString());
  }
  // Flush now and then (the Flush RPC's Collection::Snapshot), or the memtables of the shards'
  // databases (256 MiB each) would grow past the fuzzer's memory limit on a long run.
  static int64_t inputs = 0;
  if (++inputs % 4096 == 0) {
    const absl::Status flushed = (*collection)->Snapshot();
    FUZZ_CHECK(flushed.ok(), flushed.ToString());
  }
  return 0;
}
