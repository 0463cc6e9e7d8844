// Documents as applications send them, their attributes, and attribute filters.
#ifndef TESSERA_DOCUMENT_H_
#define TESSERA_DOCUMENT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "tessera/pooling.h"
#include "tessera/sparse.h"

namespace tessera {

// An attribute value: an integer, a real number or a string.
using AttributeValue = std::variant<int64_t, double, std::string>;
// A document's attributes by field name (ordered, so that encodings are deterministic).
using Attributes = std::map<std::string, AttributeValue>;

enum class AttributeType { kInt64, kDouble, kString };

// The type of a value.
AttributeType TypeOf(const AttributeValue& value);
// "int64", "double", "string".
const char* AttributeTypeName(AttributeType type);

// A value a client sent (a document id, a collection or field name, a factory string), as error
// messages quote it: in single quotes and, beyond 64 bytes, cut at a UTF-8 character boundary with
// its length: 'xxxx…' (5000 bytes). So that a message about a huge value does not become a huge
// message (gRPC carries it in a header of limited size) and is never cut inside a character.
std::string QuotedForMessage(absl::string_view value);

// The largest magnitude a token vector or query value may have: fp16's largest finite value, for
// fp32 collections as well. So every collection stores what was sent, and every MaxSim product
// and sum stays finite: a score is at most query tokens × dim × 65504² (1024 × 4096 × 65504² ≈
// 1.8e16 at the largest limits), far below fp32's 3.4e38 — while fp32 values near 3e38 would
// overflow to inf and take the top rank.
inline constexpr float kMaxVectorValue = 65504.0f;

// One document to ingest: its token matrix (num_tokens × dim fp32, row-major, L2-normalised by the
// encoder), an optional patch grid layout (needed for spatial pooling) and attributes.
struct Document {
  std::string id;
  int64_t num_tokens = 0;
  int64_t dim = 0;
  std::vector<float> tokens;
  std::optional<PatchGridLayout> layout;
  Attributes attributes;  // doubles finite (a collection refuses NaN and ±inf)
  // The document's sparse vector (term id → weight: BM25 term frequencies, SPLADE weights), for a
  // collection that declares a sparse field (CollectionSchema::sparse); refused by one that does
  // not. Indices in any order but unique (the collection sorts them), weights finite and ≥ 0, at
  // most kDefaultMaxSparseTerms terms. A document without one is in no sparse lane's answer.
  std::optional<SparseVector> sparse;
};

// One condition on an attribute. kIn matches any of `values`; kExists and kMissing take no values
// (the field is present / absent); kPrefix (string fields) matches a value that starts with
// values[0]; the others compare with values[0]. Integers and doubles compare numerically with each
// other (IEEE 754 comparisons: a NaN, which ValidateFilter refuses and a collection does not
// store, would match only kNe); strings compare lexicographically, bytewise. ±inf are valid
// bounds (`< inf` matches every finite value).
struct FilterCondition {
  enum class Op { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kExists, kMissing, kPrefix };
  std::string field;
  Op op = Op::kEq;
  std::vector<AttributeValue> values;
};

// The deepest a filter may nest (ValidateFilter): the top-level filter is depth 1, each any_of /
// none_of alternative one deeper. Bounds the recursion of evaluation and of the wire decoding.
inline constexpr int kMaxFilterDepth = 8;

// A document matches when every condition of all_of holds, at least one alternative of any_of
// matches (when any_of is not empty), and no alternative of none_of matches. Each alternative is
// itself a filter. An empty filter matches every document. A document without the field does not
// match a condition on it (not even kNe), except kMissing.
struct Filter {
  std::vector<FilterCondition> all_of;
  std::vector<Filter> any_of;
  std::vector<Filter> none_of;

  bool empty() const { return all_of.empty() && any_of.empty() && none_of.empty(); }
};

bool FilterMatches(const Filter& filter, const Attributes& attributes);

// Only `fields` of `attributes` (all of them when `fields` is empty); fields it lacks are skipped.
Attributes SelectAttributes(Attributes attributes, const std::vector<std::string>& fields);

// INVALID_ARGUMENT unless the filter nests at most kMaxFilterDepth deep and every condition names
// a field of `fields`, has a value of a comparable type (numbers with numbers, strings with
// strings) that is not NaN, exactly one value for ops other than kIn, kExists and kMissing, at
// least one for kIn, none for kExists and kMissing, and kPrefix is on a string field. Messages
// name where the condition sits: "filter condition 2 …" at the top level, "filter
// any_of[1].none_of[0] condition 0 …" inside alternatives.
absl::Status ValidateFilter(const Filter& filter,
                            const std::map<std::string, AttributeType>& fields);

}  // namespace tessera

#endif  // TESSERA_DOCUMENT_H_
