// Writes the seed corpora of the fuzz targets: valid inputs produced by the real encoders, one
// small file each, into DIR/<target>/ (tests/fuzz/corpus is DIR in the repository). Rerun it when
// an encoding changes:
//   build-fuzz/bin/fuzz_seed_generator tests/fuzz/corpus
// Regression inputs (crashes the fuzzers found) sit next to these as regression-*; this program
// leaves them alone.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "index/centroid/centroid_codebook.h"
#include "index/centroid/centroid_index.h"
#include "index/collection/schema_codec.h"
#include "index/storage/record_codec.h"
#include "server/convert.h"
#include "tessera/float16.h"
#include "tessera/npy.h"
#include "tessera/npz.h"
#include "tests/fuzz/candidate_snapshots.h"
#include "tests/fuzz/engine_fixture.h"
#include "tests/fuzz/fuzz_util.h"

namespace tessera::fuzz {
namespace {

std::string root;

void Check(const absl::Status& status, const std::string& what) {
  if (status.ok()) return;
  std::fprintf(stderr, "fuzz_seed_generator: %s: %s\n", what.c_str(), status.ToString().c_str());
  std::exit(1);
}

template <typename T>
T Value(absl::StatusOr<T> result, const std::string& what) {
  Check(result.status(), what);
  return std::move(*result);
}

void Write(const std::string& target, const std::string& name, absl::string_view bytes) {
  const std::string dir = root + "/" + target;
  std::filesystem::create_directories(dir);
  WriteScratchFile(dir + "/" + name, bytes);
}

void WriteProto(const std::string& target, const std::string& name,
                const google::protobuf::Message& message) {
  Write(target, name, message.SerializeAsString());
}

// Deterministic values in [-1, 1).
std::vector<float> Values(int64_t count, uint64_t seed) {
  std::vector<float> values(count);
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 7;
  for (float& v : values) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<float>(static_cast<int64_t>(state >> 40) - (int64_t{1} << 23)) /
        static_cast<float>(int64_t{1} << 23);
  }
  return values;
}

std::vector<float> UnitRows(int64_t rows, int64_t dim, uint64_t seed) {
  std::vector<float> values = Values(rows * dim, seed);
  for (int64_t r = 0; r < rows; ++r) {
    double norm = 0;
    for (int64_t k = 0; k < dim; ++k) norm += values[r * dim + k] * values[r * dim + k];
    for (int64_t k = 0; k < dim; ++k) values[r * dim + k] /= static_cast<float>(std::sqrt(norm));
  }
  return values;
}

void NpySeeds() {
  const std::vector<float> f = Values(6, 1);
  Write("npy", "f4-2x3.npy", Value(SerializeNpy(NpyArray::FromFloat32(2, 3, f.data())), "npy"));
  std::vector<Float16> h(6);
  FloatToHalf(f.data(), 6, h.data());
  Write("npy", "f2-3x2.npy", Value(SerializeNpy(NpyArray::FromFloat16(3, 2, h.data())), "npy"));
  Write("npy", "i4-4.npy", Value(SerializeNpy(NpyArray::FromInt32({1, -2, 3, 1 << 30})), "npy"));
  Write("npy", "i8-3.npy",
        Value(SerializeNpy(NpyArray::FromInt64({-1, 0, int64_t{1} << 40})), "npy"));
  const double d = 2.5;
  Write("npy", "f8-scalar.npy",
        Value(SerializeNpy(NpyArray::FromBytes(NpyDtype::kFloat64, {}, &d)), "npy"));
  Write("npy", "f4-0x4.npy",
        Value(SerializeNpy(NpyArray::FromBytes(NpyDtype::kFloat32, {0, 4}, f.data())), "npy"));
  // What NumPy writes and the writer never does: format 2.0, big-endian, Fortran order.
  std::string header = "{'descr': '>f4', 'fortran_order': True, 'shape': (2, 3), }";
  header.append(64 - (12 + header.size() + 1) % 64, ' ');
  header.push_back('\n');
  std::string file("\x93NUMPY\x02\x00", 8);
  const uint32_t length = static_cast<uint32_t>(header.size());
  file.append(reinterpret_cast<const char*>(&length), 4);
  file += header;
  for (int i = 0; i < 6; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &f[i], 4);
    for (int b = 3; b >= 0; --b) file.push_back(static_cast<char>(bits >> (8 * b)));
  }
  Write("npy", "f4-big-endian-fortran-v2.npy", file);
}

void NpzSeeds() {
  const std::vector<float> f = Values(8, 2);
  NpzEntries entries;
  entries.emplace_back("tokens", NpyArray::FromFloat32(2, 4, f.data()));
  entries.emplace_back("ids", NpyArray::FromInt64({7, 8}));
  Write("npz", "stored.npz", Value(SerializeNpz(entries, false), "npz"));
  Write("npz", "deflated.npz", Value(SerializeNpz(entries, true), "npz"));
  // zip64.npz and zip64-deflated.npz (the same entries with every ZIP64 record) stay as the former
  // hand-written writer left them: libzip writes ZIP64 only where an archive needs it.
}

v1::Filter ProtoFilter(const std::string& field, v1::Condition::Op op,
                       const std::vector<v1::AttributeValue>& values) {
  v1::Filter filter;
  v1::Condition* condition = filter.add_all_of();
  condition->set_field(field);
  condition->set_op(op);
  for (const v1::AttributeValue& value : values) *condition->add_values() = value;
  return filter;
}

v1::AttributeValue Int(int64_t v) {
  v1::AttributeValue value;
  value.set_int_value(v);
  return value;
}
v1::AttributeValue Str(const std::string& v) {
  v1::AttributeValue value;
  value.set_string_value(v);
  return value;
}

void RequestSeeds() {
  for (const std::string& collection : FixtureCollections()) {
    // Upsert: the seed documents under new ids, and a seed document rewritten.
    std::vector<v1::Document> documents = SeedDocuments(collection);
    v1::UpsertRequest upsert;
    upsert.set_collection(collection);
    for (size_t i = 0; i < documents.size() && i < 3; ++i) {
      v1::Document* document = upsert.add_documents();
      *document = documents[i];
      document->set_id(absl::StrCat("new-", i));
    }
    WriteProto("upsert", collection + "-new.pb", upsert);
    v1::UpsertRequest rewrite;
    rewrite.set_collection(collection);
    *rewrite.add_documents() = documents.back();
    WriteProto("upsert", collection + "-rewrite.pb", rewrite);

    // Search: the first seed document's tokens as the query, with options.
    v1::SearchRequest search;
    search.set_collection(collection);
    const v1::Matrix& tokens = documents[0].tokens();
    const std::vector<float> values = Value(server::DecodeMatrix(tokens, 0, "tokens"), "decode");
    server::EncodeMatrix(values.data(), 2, kFixtureDim,
                         collection == "pages" ? VectorDtype::kFloat16 : VectorDtype::kFloat32,
                         search.mutable_query());
    search.set_k(3);
    WriteProto("search", collection + ".pb", search);
    search.set_explain(true);
    search.set_exhaustive(true);
    WriteProto("search", collection + "-explain-exhaustive.pb", search);
    search.set_explain(false);
    search.set_exhaustive(false);
    search.set_num_candidates(4);
    search.set_per_token_candidates(2);
    search.set_nprobe(3);
    if (collection == "papers") {
      *search.mutable_filter() = ProtoFilter("year", v1::Condition::OP_GE, {Int(2019)});
    } else if (collection == "pages") {
      *search.mutable_filter() = ProtoFilter("page", v1::Condition::OP_IN, {Int(1), Int(3)});
    } else {
      *search.mutable_filter() = ProtoFilter("tag", v1::Condition::OP_NE, {Str("t1")});
    }
    WriteProto("search", collection + "-filter.pb", search);

    // Get: a seed id and an unknown one.
    v1::GetRequest get;
    get.set_collection(collection);
    get.set_id(documents[1].id());
    WriteProto("get", collection + ".pb", get);
  }
  v1::GetRequest missing;
  missing.set_collection("papers");
  missing.set_id("no-such-document");
  WriteProto("get", "missing.pb", missing);
}

void FilterSeeds() {
  // Byte 0: even = text (bit 1: fields declared), odd = a v1.Filter.
  const std::vector<std::pair<std::string, std::string>> texts = {
      {"year-ge", "\x02year>=2020"},
      {"lang-in", "\x02lang in en,de,'x,y'"},
      {"score-lt", "\x02score<0.5"},
      {"undeclared-eq", std::string("\x00tag==\"a b\"", 11)},
      {"undeclared-ne", std::string("\x00n!=-3", 6)},
      {"in-brackets", "\x02year in [2019, 2020]"},
      {"le", "\x02score<=1e-3"},
      {"gt", "\x02year>1999"}};
  for (const auto& [name, text] : texts) Write("filter", name + ".txt", text);
  v1::Filter filter = ProtoFilter("year", v1::Condition::OP_IN, {Int(1), Int(2)});
  *filter.add_all_of() = ProtoFilter("lang", v1::Condition::OP_EQ, {Str("en")}).all_of(0);
  Write("filter", "proto-two-conditions.pb", "\x01" + filter.SerializeAsString());
}

void ConfigSeeds() {
  Write("server_config", "full.yaml",
        "data_dir: /var/lib/tessera\n"
        "listen: 0.0.0.0:50051\n"
        "metrics_listen: \"\"\n"
        "api_keys: /etc/tessera/keys\n"
        "threads: 4\n"
        "resident_rerank_bytes: 1073741824\n"
        "sync_writes: false\n"
        "rerank_device: cpu\n"
        "max_message_bytes: 4096\n"
        "max_tokens_per_document: 2048\n"
        "max_documents_per_batch: 64\n"
        "max_k: 100\n"
        "max_num_candidates: 1000\n"
        "max_query_tokens: 32\n"
        "shutdown_grace_seconds: 2.5\n");
  Write("server_config", "tls.yaml",
        "tls_cert: /etc/tessera/cert.pem\ntls_key: /etc/tessera/key.pem\n"
        "tls_client_ca: /etc/tessera/ca.pem\n");
  Write("server_config", "flow.yaml", "{listen: '[::1]:0', threads: 0, sync_writes: true}\n");
  Write("server_config", "anchors.yaml", "data_dir: &d ./data\nlisten: *d\n# comment\n");
}

void RecordSeeds() {
  using namespace internal;
  // Byte 0: the decoder (see record_codec_fuzzer.cc); the CRC is kept as written.
  auto write = [](const std::string& name, uint8_t mode, const std::string& value) {
    Write("record_codec", name, std::string(1, static_cast<char>(mode)) + value);
  };
  DocumentRecord record;
  record.iid = 42;
  record.external_id = "doc-42";
  record.version = 3;
  record.num_tokens = 6;
  record.layout = PatchGridLayout{2, 2, 1, 1};
  record.attributes = {{"lang", std::string("en")}, {"score", 0.5}, {"year", int64_t{2020}}};
  record.member_offsets = {0, 2, 4, 6};
  record.members = {0, 1, 2, 3, 4, 5};
  // Beside these, corpus/record_codec keeps document-fixed-width and document-plain-fixed-width:
  // the same records as written before the membership took varints (kDocument), which the
  // encoder no longer writes and the decoder still reads.
  write("document", 0x80, EncodeDocumentRecord(record));
  record.layout.reset();
  record.attributes.clear();
  write("document-plain", 0x80, EncodeDocumentRecord(record));
  const std::vector<float> values = Values(6, 3);
  write("matrix-fp32", 0x81,
        EncodeStoredMatrix(MatrixFromFloat(values, 2, 3, VectorDtype::kFloat32)));
  write("matrix-fp16", 0x81,
        EncodeStoredMatrix(MatrixFromFloat(values, 3, 2, VectorDtype::kFloat16)));
  write("id", 0x82, EncodeIdValue(42));
  write("counter", 0x83, EncodeCounterValue(1234567));
  write("meta", 0x84, EncodeMetaValue("tessera-collection-schema 1\nname x\n"));
  DocumentCodes codes;
  codes.centroids = {1, 200, 3};
  codes.codes = "abcdefghijkl";  // 3 × 4 bytes
  write("codes", 0x85 | (3 << 3), EncodeCodesValue(SerializeDocumentCodes(codes)));
  write("iid-key", 0x86, EncodeIidKey(42));
  write("codes-key", 0x86, EncodeCodesKey(2, 42));
}

void SchemaSeeds() {
  CollectionSchema schema;
  schema.name = "papers";
  schema.dim = 128;
  schema.attributes = {{"year", AttributeType::kInt64}, {"lang", AttributeType::kString}};
  Write("schema_codec", "default.txt", internal::EncodeSchema(schema));
  schema.dtype = VectorDtype::kFloat32;
  schema.num_shards = 4;
  SpatialPoolingOptions spatial;
  spatial.mode = SpatialMode::kRowWindows;
  spatial.keep_special_tokens = true;
  schema.pooling.spatial = spatial;
  schema.candidates.kind = CandidateSpec::Kind::kGlobalMean;
  schema.candidates.factory = "HNSW32";
  schema.candidates.residual_bits = 4;
  schema.candidates.rerank_from_codes = false;
  Write("schema_codec", "spatial.txt", internal::EncodeSchema(schema));
  // A schema written before min_vectors and the centroid line existed.
  Write("schema_codec", "old.txt",
        "tessera-collection-schema 1\nname old\ndim 8\ndtype fp16\nshards 1\n"
        "hierarchical 2 ward 0 0\ncandidates pooled 4 auto\n");
}

void CandidateSeeds() {
  // Byte 0 = 0: the target gets past the checksums (see candidate_snapshot_fuzzer.cc).
  for (const auto& [name, file] : CandidateSnapshots()) {
    Write("candidate_snapshot", name + ".snapshot", std::string(1, '\0') + file);
  }
}

void CodebookSeeds() {
  using namespace internal;
  for (const int nbits : {2, 4}) {
    const int64_t dim = nbits == 2 ? 8 : 4;
    const std::vector<float> sample = UnitRows(64, dim, 99 + nbits);
    CentroidTrainingOptions options;
    options.num_centroids = 4;
    options.nbits = nbits;
    std::unique_ptr<CentroidCodebook> codebook =
        Value(CentroidCodebook::Train(FloatMatrixView{sample.data(), 64, dim}, options, nullptr),
              "codebook");
    Write("centroid_codebook", absl::StrCat("bits", nbits, ".codebook"),
          std::string(1, '\0') + codebook->Serialize());
  }
}

}  // namespace
}  // namespace tessera::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seed_generator CORPUS_DIR\n");
    return 2;
  }
  tessera::fuzz::root = argv[1];
  tessera::fuzz::NpySeeds();
  tessera::fuzz::NpzSeeds();
  tessera::fuzz::RequestSeeds();
  tessera::fuzz::FilterSeeds();
  tessera::fuzz::ConfigSeeds();
  tessera::fuzz::RecordSeeds();
  tessera::fuzz::SchemaSeeds();
  tessera::fuzz::CandidateSeeds();
  tessera::fuzz::CodebookSeeds();
  return 0;
}
