// A tour of the C++ client (docs/clients/cpp.md shows this file verbatim): create a collection,
// upsert documents, search with filters, attributes and groups, count, scroll, get, delete.
//
//   build/bin/tessera-cpp-quickstart [--addr HOST:PORT] [--api_key KEY] [--tls_ca CA.pem]
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/cpp/client.h"

namespace {

using tessera::AttributeValue;
using tessera::Filter;
using tessera::FilterCondition;
using Op = tessera::FilterCondition::Op;
namespace tc = tessera::client;

constexpr uint32_t kDim = 128;

// Stops the program with the call's status (code and the server's message).
template <typename T>
T OrDie(absl::StatusOr<T> result, const char* what) {
  if (!result.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, result.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(result);
}
void OrDie(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}

// n unit vectors of kDim values, row-major: stand-ins for a ColBERT model's token embeddings.
std::vector<float> RandomTokens(std::mt19937& rng, uint32_t n) {
  std::normal_distribution<float> normal;
  std::vector<float> values(size_t{n} * kDim);
  for (uint32_t row = 0; row < n; ++row) {
    float* v = values.data() + size_t{row} * kDim;
    float norm = 0;
    for (uint32_t j = 0; j < kDim; ++j) {
      v[j] = normal(rng);
      norm += v[j] * v[j];
    }
    for (uint32_t j = 0; j < kDim; ++j) v[j] /= std::sqrt(norm);
  }
  return values;
}

FilterCondition Where(std::string field, Op op, AttributeValue value) {
  return FilterCondition{std::move(field), op, {std::move(value)}};
}

}  // namespace

int main(int argc, char** argv) {
  // Connecting: the address, an API key (sent as `authorization: Bearer KEY`), TLS.
  tc::ClientOptions options;
  options.address = "127.0.0.1:50051";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--addr") == 0) options.address = argv[i + 1];
    if (std::strcmp(argv[i], "--api_key") == 0) options.api_key = argv[i + 1];
    if (std::strcmp(argv[i], "--tls_ca") == 0) {
      options.use_tls = true;
      options.tls_root_cert_file = argv[i + 1];
    }
  }
  options.timeout = absl::Seconds(10);  // per call
  std::unique_ptr<tc::Client> client = OrDie(tc::Client::Connect(options), "connect");

  // A collection of 128-dim token vectors with two attributes that filters may use.
  tessera::v1::CollectionSchema schema;
  schema.set_name("quickstart");
  schema.set_dim(kDim);
  (*schema.mutable_attributes())["year"] = tessera::v1::ATTRIBUTE_TYPE_INT64;
  (*schema.mutable_attributes())["lang"] = tessera::v1::ATTRIBUTE_TYPE_STRING;
  schema = OrDie(client->CreateCollection(schema), "create");
  std::printf("created %s: pool factor %u\n", schema.name().c_str(),
              schema.hierarchical().pool_factor());

  // 100 documents of 32 tokens; doc i has year 2020 + i % 5 and lang "en" (odd i) or "fr".
  std::mt19937 rng(7);
  std::vector<std::vector<float>> tokens;
  std::vector<tc::DocumentInput> documents;
  for (int i = 0; i < 100; ++i) {
    tokens.push_back(RandomTokens(rng, 32));
    tc::DocumentInput document;
    document.id = "doc" + std::to_string(i);
    document.tokens = tc::TokenMatrix::FromFloat32(32, kDim, tokens.back());
    document.attributes["year"] = int64_t{2020 + i % 5};
    document.attributes["lang"] = std::string(i % 2 ? "en" : "fr");
    documents.push_back(std::move(document));
  }
  std::vector<tc::DocumentResult> results =
      OrDie(client->Upsert("quickstart", std::move(documents)), "upsert");
  int stored = 0;
  for (const tc::DocumentResult& result : results) stored += result.status.ok();
  std::printf("upserted %d documents\n", stored);

  // Search: the first 16 tokens of doc7 as the query, its 5 best documents.
  const tc::TokenMatrix query =
      tc::TokenMatrix::FromFloat32(16, kDim, absl::MakeConstSpan(tokens[7].data(), 16 * kDim));
  tc::SearchOptions search;
  search.k = 5;
  tc::SearchResult hits = OrDie(client->Search("quickstart", query, search), "search");
  std::printf("top hit: %s\n", hits.hits[0].id.c_str());
  std::printf("  score %.3f, %.2f ms\n", hits.hits[0].score, hits.timings.total_ms);

  // Filters: all_of (every condition), any_of (one alternative), none_of (no alternative).
  search.filter.all_of = {Where("year", Op::kGe, int64_t{2023}), Where("lang", Op::kEq, "en")};
  search.with_attributes = true;  // each hit's attributes
  hits = OrDie(client->Search("quickstart", query, search), "filtered search");
  for (const tc::SearchHit& hit : hits.hits) {
    std::printf("  %s year %lld\n", hit.id.c_str(),
                static_cast<long long>(std::get<int64_t>(hit.attributes.at("year"))));
  }

  // Count what a filter matches (empty: every document).
  std::printf("count: %llu\n",
              static_cast<unsigned long long>(OrDie(client->Count("quickstart"), "count")));
  std::printf(
      "count year >= 2023 and en: %llu\n",
      static_cast<unsigned long long>(OrDie(client->Count("quickstart", search.filter), "count")));
  Filter either;  // year 2020, or fr documents of 2021
  either.any_of.push_back(Filter{{Where("year", Op::kEq, int64_t{2020})}, {}, {}});
  either.any_of.push_back(
      Filter{{Where("lang", Op::kEq, "fr"), Where("year", Op::kEq, int64_t{2021})}, {}, {}});
  std::printf("count any_of: %llu\n",
              static_cast<unsigned long long>(OrDie(client->Count("quickstart", either), "count")));
  Filter not_fr;
  not_fr.none_of.push_back(Filter{{Where("lang", Op::kEq, "fr")}, {}, {}});
  std::printf("count none_of fr: %llu\n",
              static_cast<unsigned long long>(OrDie(client->Count("quickstart", not_fr), "count")));

  // Scroll: every matching document, a page at a time, ascending by id.
  tc::ScrollOptions scroll;
  scroll.filter.all_of = {Where("year", Op::kEq, int64_t{2024}), Where("lang", Op::kEq, "en")};
  scroll.limit = 4;
  scroll.with_attributes = true;
  scroll.attribute_fields = {"year"};
  size_t pages = 0, scrolled = 0;
  do {
    tc::ScrollPage page = OrDie(client->Scroll("quickstart", scroll), "scroll");
    ++pages;
    scrolled += page.documents.size();
    scroll.after = page.next_after;
  } while (!scroll.after.empty());
  std::printf("scrolled %zu documents in %zu pages\n", scrolled, pages);

  // Grouped results: the best 3 years, each with its best 2 hits.
  tc::SearchOptions grouped;
  grouped.k = 5;
  grouped.group_by = "year";
  grouped.group_size = 2;
  grouped.groups = 3;
  hits = OrDie(client->Search("quickstart", query, grouped), "grouped search");
  for (const tc::SearchGroup& group : hits.groups) {
    std::printf("group year %lld: %s (%zu hits)\n",
                static_cast<long long>(std::get<int64_t>(group.value)), group.hits[0].id.c_str(),
                group.hits.size());
  }

  // Get: what the server stores for a document (its pooled rerank vectors).
  tc::StoredDocument doc = OrDie(client->Get("quickstart", "doc7"), "get");
  std::printf("doc7: %u tokens, %u vectors of %u\n", doc.num_tokens, doc.num_vectors, doc.dim);

  // Delete by id (whether each existed) and by filter (how many matched).
  std::vector<bool> existed =
      OrDie(client->Delete("quickstart", {"doc1", "no-such-doc"}), "delete");
  std::printf("deleted doc1: %s, no-such-doc: %s\n", existed[0] ? "yes" : "no",
              existed[1] ? "yes" : "no");
  Filter old_fr;
  old_fr.all_of = {Where("lang", Op::kEq, "fr"), Where("year", Op::kEq, int64_t{2020})};
  std::printf("deleted by filter: %llu\n",
              static_cast<unsigned long long>(
                  OrDie(client->DeleteMatching("quickstart", old_fr), "delete")));
  std::printf("count after deletes: %llu\n",
              static_cast<unsigned long long>(OrDie(client->Count("quickstart"), "count")));

  // Errors are absl::Status values with the gRPC code and the server's message.
  absl::StatusOr<tc::StoredDocument> gone = client->Get("quickstart", "doc1");
  if (absl::IsNotFound(gone.status())) {
    std::printf("get doc1: NOT_FOUND (%s)\n", std::string(gone.status().message()).c_str());
  }

  OrDie(client->DropCollection("quickstart"), "drop");
  return 0;
}
