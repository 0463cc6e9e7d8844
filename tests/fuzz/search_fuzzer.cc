// Fuzzes Search as the server runs it: the bytes as a tessera.v1.SearchRequest (bytes protobuf
// cannot parse are skipped) sent to the standalone server's backend (EngineBackend::Search: the
// collection, DecodeMatrix of the query against its dim, SearchOptionsFromProto, Collection::Search
// and SearchResultToProto) over the fixture engine (engine_fixture.h), whose collections hold only
// their seed documents.
//
// Asserts, beyond no crash or undefined behaviour (ASan, UBSan):
// - a failed search is INVALID_ARGUMENT (or NOT_FOUND for the collection);
// - at most k hits, best first, equal scores by ascending id, no id twice;
// - every hit is a seed document that matches the filter, and its score is the exact MaxSim of the
//   query over the document's vectors as Get returns them (within fp32 rounding, where fp32 does
//   not overflow);
// - with explain, one token match per query token, naming a vector the document has.
#include <grpcpp/server_context.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/convert.h"
#include "tests/fuzz/engine_fixture.h"
#include "tests/fuzz/fuzz_util.h"

namespace tessera::fuzz {
namespace {

// Σ over query rows of the best inner product with a document vector, in double; *magnitude gets
// the same sum over |products|, a bound on every fp32 partial sum of the scorer.
double ExactMaxSim(const std::vector<float>& query, int64_t rows, const StoredDocument& document,
                   double* magnitude) {
  const int64_t dim = document.dim;
  double total = 0;
  *magnitude = 0;
  for (int64_t q = 0; q < rows; ++q) {
    double best = -std::numeric_limits<double>::infinity();
    double largest = 0;
    for (int64_t v = 0; v < document.num_vectors(); ++v) {
      double dot = 0, absolute = 0;
      for (int64_t k = 0; k < dim; ++k) {
        const double product =
            static_cast<double>(query[q * dim + k]) * document.vectors[v * dim + k];
        dot += product;
        absolute += std::abs(product);
      }
      best = std::max(best, dot);
      largest = std::max(largest, absolute);
    }
    total += best;
    *magnitude += largest;
  }
  return total;
}

// How far a rerank_from_codes collection's score may be from the MaxSim of its decoded vectors:
// CompactQuery::ErrorBound (collection.h), bounded here from the fixture's data. Its rows are unit
// vectors, so every value and centroid component lies in [-1, 1] and every residual level in
// [-2, 2]; a nibble covers 4 / bits dimensions, so its table's range is at most
// (4 / bits) · 4 · max_d |q_id|, and row i's error at most ⌈dim · bits / 4⌉ · range / 255 / 2.
double CodesErrorBound(const std::vector<float>& query, int64_t rows, int64_t dim, int bits) {
  const double nibbles = std::ceil(static_cast<double>(dim * bits) / 4.0);
  double bound = 0;
  for (int64_t q = 0; q < rows; ++q) {
    double largest = 0;
    for (int64_t k = 0; k < dim; ++k) {
      largest = std::max(largest, std::abs(static_cast<double>(query[q * dim + k])));
    }
    bound += nibbles * (16.0 / bits) * largest / 255.0 / 2.0;
  }
  return bound;
}

}  // namespace
}  // namespace tessera::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  using namespace tessera::fuzz;
  v1::SearchRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;

  // What the Search handler runs once the request is admitted and names a collection.
  const grpc::CallbackServerContext call;  // no deadline
  v1::SearchResponse response;
  const absl::Status searched = FixtureBackend().Search(call, request, &response);
  if (!searched.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(searched) || absl::IsNotFound(searched),
               searched.ToString());
    return 0;
  }

  // The request as the backend read it, through the same functions, for the checks.
  absl::StatusOr<std::shared_ptr<Collection>> collection = FindCollection(request.collection());
  FUZZ_CHECK(collection.ok(), collection.status().ToString());
  const absl::StatusOr<std::vector<float>> query =
      server::DecodeMatrix(request.query(), (*collection)->schema().dim, "query");
  FUZZ_CHECK(query.ok(), query.status().ToString());
  const absl::StatusOr<SearchOptions> options = server::SearchOptionsFromProto(request);
  FUZZ_CHECK(options.ok(), options.status().ToString());
  const int64_t rows = request.query().rows();

  FUZZ_CHECK(response.hits_size() <= options->k, "more than k hits");
  std::set<std::string> seen;
  for (int i = 0; i < response.hits_size(); ++i) {
    const v1::Hit& hit = response.hits(i);
    FUZZ_CHECK(seen.insert(hit.id()).second, "hit '" + hit.id() + "' twice");
    FUZZ_CHECK(IsSeedId(request.collection(), hit.id()), "hit '" + hit.id() + "' is no document");
    if (i > 0) {
      const v1::Hit& previous = response.hits(i - 1);
      FUZZ_CHECK(previous.score() > hit.score() ||
                     (previous.score() == hit.score() && previous.id() < hit.id()),
                 absl::StrCat("hits out of order at ", i));
    }
    const absl::StatusOr<StoredDocument> document = (*collection)->Get(hit.id());
    FUZZ_CHECK(document.ok(), document.status().ToString());
    FUZZ_CHECK(FilterMatches(options->filter, document->attributes),
               "hit '" + hit.id() + "' does not match the filter");
    double magnitude = 0;
    const double exact = ExactMaxSim(*query, rows, *document, &magnitude);
    // Scores whose fp32 partial sums may overflow (a query of huge values) are left out.
    if (magnitude < 1e30) {
      const CollectionSchema& schema = (*collection)->schema();
      const double tolerance =
          1e-4 * (magnitude + static_cast<double>(rows)) +
          (schema.candidates.rerank_from_codes
               ? CodesErrorBound(*query, rows, schema.dim, EffectiveResidualBits(schema.candidates))
               : 0.0);
      FUZZ_CHECK(
          std::abs(hit.score() - exact) <= tolerance,
          absl::StrCat("hit '", hit.id(), "' score ", hit.score(), ", exact MaxSim ", exact));
    }
    if (options->explain) {
      FUZZ_CHECK(hit.explanation_size() == rows, "explanation size");
      for (const v1::TokenMatch& match : hit.explanation()) {
        FUZZ_CHECK(match.document_vector() < document->num_vectors(),
                   absl::StrCat("explanation names vector ", match.document_vector()));
      }
    }
  }
  return 0;
}
