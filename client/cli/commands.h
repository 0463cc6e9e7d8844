// The `tessera` command line: flag handling, the commands (collections, ingest, search, get,
// delete, stats, flush) and their human and --json output. tessera_main.cc only calls
// RunTesseraCli.
#ifndef TESSERA_CLIENT_CLI_COMMANDS_H_
#define TESSERA_CLIENT_CLI_COMMANDS_H_

#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/cli/args.h"
#include "client/cli/json.h"
#include "client/cpp/client.h"
#include "tessera/document.h"

namespace tessera::client {

// Exit codes.
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;  // the command failed: "tessera: CODE: message" on stderr
inline constexpr int kExitUsage = 2;  // the command line is wrong

// Runs one command line (without the program name). Results go to `out`, progress, warnings and
// errors to `err`. Returns the exit code.
int RunTesseraCli(const std::vector<std::string>& arguments, std::ostream& out, std::ostream& err);

std::string TesseraUsage();
// `tessera COMMAND --help`: TesseraUsage()'s lines for COMMAND (`words` as given, "collections"
// and its second word counting as one command); all of it for no or an unknown command.
std::string CommandUsage(const std::vector<std::string>& words);

namespace internal {

// The schema `collections create NAME …` asks for. INVALID_ARGUMENT (a usage error) naming the
// flag for a malformed or contradictory value.
absl::StatusOr<v1::CollectionSchema> SchemaFromArgs(const std::string& name,
                                                    const ParsedArgs& args);

// Parses one --filter expression: FIELD==V, FIELD!=V, FIELD<V, FIELD<=V, FIELD>V, FIELD>=V or
// "FIELD in V1,V2,…". Values take the type the schema gives the field (`fields`); for a field the
// schema does not declare, a quoted value is a string, then an integer, a number, or a string.
// INVALID_ARGUMENT for a malformed expression or a value that does not fit the field's type.
absl::StatusOr<FilterCondition> ParseFilterExpression(
    absl::string_view expression, const std::map<std::string, v1::AttributeType>& fields);

// Conditions joined by "&&" (each as ParseFilterExpression reads it), as one filter: an
// alternative of --any-of / --none-of.
absl::StatusOr<Filter> ParseFilterConjunction(
    absl::string_view expressions, const std::map<std::string, v1::AttributeType>& fields);

// --json outputs.
// {"results":[{"id","score","version"[,"explanation":[{"query_token","document_vector",
//  "similarity","covered_tokens"}]]}],"timings_ms":{"candidates","fetch","rerank","total"},
//  "documents_scored","exhaustive"}
Json SearchResultToJson(const SearchResult& result, bool explain);
// {"id","version","num_tokens","num_vectors","dim","dtype","attributes":{…},
//  "layout":{"rows","cols","prefix","suffix"}|null[,"vectors":[[…]…],"members":[[…]…]]}
Json StoredDocumentToJson(const StoredDocument& document, bool with_vectors);
// {"collection", then every CollectionStats field by its proto name}
Json StatsToJson(const std::string& collection, const v1::CollectionStats& stats);
// A router's shard map: [{"shard", "replicas": [{"node_id", "address", "state"}]}].
Json ShardsToJson(const std::vector<v1::ShardStatus>& shards);
// {"name","dim","dtype","pooling":{…},"candidates":{…},"attributes":{NAME:TYPE},"num_shards"}
Json SchemaToJson(const v1::CollectionSchema& schema);
Json AttributesToJson(const Attributes& attributes);

// Human outputs, every id, name and string value escaped for the terminal (TerminalSafe).
// The table of `search`: rank, id, score, version (and the explanation), then the timings.
std::string SearchResultToText(const SearchResult& result);
// The fields of `get`, one per line, and with `with_vectors` one line per vector.
std::string StoredDocumentToText(const StoredDocument& document, bool with_vectors);

// One line describing a schema: "dim 128, fp16, ward pooling p=2, candidates pooled p=4 (auto)…".
std::string DescribeSchema(const v1::CollectionSchema& schema);

}  // namespace internal
}  // namespace tessera::client

#endif  // TESSERA_CLIENT_CLI_COMMANDS_H_
