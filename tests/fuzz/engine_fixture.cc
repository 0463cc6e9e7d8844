#include "tests/fuzz/engine_fixture.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "index/collection/collection_impl.h"
#include "server/convert.h"
#include "server/engine_backend.h"
#include "server/metrics.h"
#include "server/services.h"
#include "tests/fuzz/fuzz_util.h"

namespace tessera::fuzz {
namespace {

void Die(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "engine fixture: %s: %s\n", what.c_str(), status.ToString().c_str());
  std::abort();
}

// Deterministic pseudo-random unit vectors: the same seeds in every process and generator run.
std::vector<float> UnitRows(int64_t rows, uint64_t seed) {
  std::vector<float> values(rows * kFixtureDim);
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (float& v : values) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<float>(static_cast<int64_t>(state >> 40) - (int64_t{1} << 23)) /
        static_cast<float>(int64_t{1} << 23);
  }
  for (int64_t r = 0; r < rows; ++r) {
    float norm = 0;
    for (int64_t k = 0; k < kFixtureDim; ++k)
      norm += values[r * kFixtureDim + k] * values[r * kFixtureDim + k];
    norm = std::sqrt(norm);
    for (int64_t k = 0; k < kFixtureDim; ++k) values[r * kFixtureDim + k] /= norm;
  }
  return values;
}

CollectionSchema Schema(const std::string& name) {
  CollectionSchema schema;
  schema.name = name;
  schema.dim = kFixtureDim;
  if (name == "papers") {
    schema.attributes = {{"year", AttributeType::kInt64},
                         {"score", AttributeType::kDouble},
                         {"lang", AttributeType::kString}};
  } else if (name == "pages") {
    schema.dtype = VectorDtype::kFloat32;
    schema.num_shards = 2;
    SpatialPoolingOptions spatial;
    spatial.mode = SpatialMode::kTiles;
    spatial.keep_special_tokens = true;
    schema.pooling.spatial = spatial;
    schema.pooling.hierarchical.reset();
    schema.candidates.kind = CandidateSpec::Kind::kGlobalMean;
    schema.attributes = {{"page", AttributeType::kInt64}};
  } else {  // codes
    schema.pooling.hierarchical->pool_factor = 1;
    schema.candidates.factory = "centroid";
    schema.candidates.residual_bits = 4;
    schema.candidates.centroid_min_training_vectors = 256;  // the smallest ValidateSchema takes
    schema.candidates.rerank_from_codes = true;
    schema.attributes = {{"tag", AttributeType::kString}};
  }
  return schema;
}

struct Fixture {
  server::ServerConfig config;
  std::unique_ptr<Engine> engine;
  server::Metrics metrics;
  server::ServiceContext context;
  std::unique_ptr<server::EngineBackend> backend;
};

Fixture* OpenFixture() {
  auto* fixture = new Fixture;
  EngineOptions options;
  options.threads = 1;
  options.sync_writes = false;
  options.resident_rerank_bytes = fixture->config.resident_rerank_bytes;
  options.limits.max_tokens_per_document = fixture->config.max_tokens_per_document;
  options.limits.max_k = static_cast<int>(fixture->config.max_k);
  options.limits.max_num_candidates = static_cast<int>(fixture->config.max_num_candidates);
  options.limits.max_query_tokens = static_cast<int>(fixture->config.max_query_tokens);
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Open(ScratchDir() + "/data", options);
  if (!engine.ok()) Die("Engine::Open", engine.status());
  fixture->engine = std::move(*engine);
  fixture->context.engine = fixture->engine.get();
  fixture->context.metrics = &fixture->metrics;
  fixture->context.config = fixture->config;
  fixture->backend = std::make_unique<server::EngineBackend>(&fixture->context);
  fixture->context.backend = fixture->backend.get();
  for (const std::string& name : FixtureCollections()) {
    absl::StatusOr<std::shared_ptr<Collection>> collection =
        fixture->engine->CreateCollection(Schema(name));
    if (!collection.ok()) Die(absl::StrCat("creating ", name), collection.status());
    std::vector<Document> documents;
    int index = 0;
    for (const v1::Document& proto : SeedDocuments(name)) {
      absl::StatusOr<Document> document = server::DocumentFromProto(proto, kFixtureDim, index++);
      if (!document.ok()) Die(absl::StrCat("seed document of ", name), document.status());
      documents.push_back(std::move(*document));
    }
    for (const UpsertOutcome& outcome : (*collection)->Upsert(std::move(documents))) {
      if (!outcome.status.ok()) Die(absl::StrCat("seeding ", name), outcome.status);
    }
    // The centroid index trains in the background once the seeds cross its threshold; wait, so
    // that every input meets the same stage 1.
    if (auto* impl = dynamic_cast<internal::CollectionImpl*>(collection->get())) {
      impl->WaitForTrainingForTesting();
    }
  }
  return fixture;
}

Fixture& TheFixture() {
  // Never destroyed: the process ends with the engine open, as a killed server would.
  static Fixture* const fixture = OpenFixture();
  return *fixture;
}

}  // namespace

const std::vector<std::string>& FixtureCollections() {
  static const auto* const names = new std::vector<std::string>{"papers", "pages", "codes"};
  return *names;
}

std::vector<v1::Document> SeedDocuments(const std::string& collection) {
  std::vector<v1::Document> documents;
  const int count = collection == "codes" ? 8 : 5;
  for (int n = 0; n < count; ++n) {
    v1::Document document;
    document.set_id(absl::StrCat(collection, "-", n));
    // pages: a 2 × 3 grid between one prefix and one suffix token; codes: 40 (8 × 40 vectors
    // pass its training threshold of 256); others: 4 … 8 tokens.
    const int64_t tokens = collection == "pages" ? 8 : (collection == "codes" ? 40 : 4 + n);
    const std::vector<float> values = UnitRows(tokens, collection.size() * 100 + n);
    server::EncodeMatrix(values.data(), tokens, kFixtureDim,
                         collection == "pages" ? VectorDtype::kFloat32 : VectorDtype::kFloat16,
                         document.mutable_tokens());
    auto& attributes = *document.mutable_attributes();
    if (collection == "papers") {
      attributes["year"].set_int_value(2018 + n);
      attributes["score"].set_double_value(0.25 * n);
      attributes["lang"].set_string_value(n % 2 == 0 ? "en" : "de");
    } else if (collection == "pages") {
      v1::PatchGrid* grid = document.mutable_layout();
      grid->set_rows(2);
      grid->set_cols(3);
      grid->set_prefix_tokens(1);
      grid->set_suffix_tokens(1);
      attributes["page"].set_int_value(n);
    } else {
      attributes["tag"].set_string_value(absl::StrCat("t", n % 3));
    }
    documents.push_back(std::move(document));
  }
  return documents;
}

Engine& FixtureEngine() { return *TheFixture().engine; }

const server::ServerConfig& FixtureConfig() { return TheFixture().config; }

server::Backend& FixtureBackend() { return *TheFixture().backend; }

absl::StatusOr<std::shared_ptr<Collection>> FindCollection(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("collection: empty name");
  return FixtureEngine().GetCollection(name);
}

bool IsSeedId(const std::string& collection, const std::string& id) {
  for (const v1::Document& document : SeedDocuments(collection)) {
    if (document.id() == id) return true;
  }
  return false;
}

}  // namespace tessera::fuzz
