// The engine behind the Upsert, Search and Get fuzzers, and the backend they send requests to: the
// standalone server's own (server/engine_backend.h), so that a fuzzer runs the request mapping that
// production runs, from the tessera.v1 message to the engine and back.
//
// Each fuzzer process opens one tessera::Engine on a fresh scratch data directory with three small
// collections of dim 8 — "papers" (fp16, Ward pooling, int64/double/string attributes), "pages"
// (fp32, spatial tile pooling that needs a layout, global-mean candidates, 2 shards) and "codes"
// (a trained centroid index, reranking from the codes) — holding the seed documents of
// SeedDocuments(), written through DocumentFromProto and Collection::Upsert as the Upsert handler
// writes them. The seed generator uses the same documents for the request seeds.
#ifndef TESSERA_TESTS_FUZZ_ENGINE_FIXTURE_H_
#define TESSERA_TESTS_FUZZ_ENGINE_FIXTURE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/backend.h"
#include "server/config.h"
#include "tessera/collection.h"
#include "tessera/engine.h"
#include "tessera/v1/ingest.pb.h"

namespace tessera::fuzz {

inline constexpr int64_t kFixtureDim = 8;

// The collection names, in creation order.
const std::vector<std::string>& FixtureCollections();

// The documents each collection is seeded with (ids "<collection>-<n>"), as an Upsert request
// carries them.
std::vector<v1::Document> SeedDocuments(const std::string& collection);

// The engine, opened on first use with the collections and their seed documents (aborts if that
// fails: a broken fixture is not a finding). Engine and server options are the defaults of
// ServerConfig, as tessera-server maps them, except sync_writes off and one thread.
Engine& FixtureEngine();
// The server configuration the handlers consult (max_documents_per_batch).
const server::ServerConfig& FixtureConfig();
// The standalone server's backend over FixtureEngine() and FixtureConfig(): what the public
// services call once a request is admitted and names a collection. Search takes a
// grpc::CallbackServerContext only for its deadline; a default-constructed one has none.
server::Backend& FixtureBackend();

// services.cc's FindCollection: INVALID_ARGUMENT for an empty name, else Engine::GetCollection.
absl::StatusOr<std::shared_ptr<Collection>> FindCollection(const std::string& name);

// True for the ids of SeedDocuments(collection).
bool IsSeedId(const std::string& collection, const std::string& id);

}  // namespace tessera::fuzz

#endif  // TESSERA_TESTS_FUZZ_ENGINE_FIXTURE_H_
