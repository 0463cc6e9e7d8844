// Fuzzes the candidate index snapshot reader, CandidateIndex::Load (index/candidate/
// candidate_index.h): the file a shard reads back at open — header, metadata, document table —
// and how Load reconciles the table with the FAISS index it reads (tombstones, counts, dims).
//
// Input: byte 0 is a mode, the rest the snapshot file (the seeds are real snapshots, see
// candidate_snapshots.h). Mode bit 0 set: the file is loaded as it is, checksums and all. Clear:
// the fuzzer gets past the checksums — the header's payload length and both CRC-32s are
// recomputed — but not into FAISS's own bytes: the FAISS write_index section is replaced by a
// real one (the one written for the factory the metadata names), and its length field too unless
// mode bit 1 is set. FAISS 1.7.3's reader trusts the sizes it reads (it resizes vectors of up to
// 2^40 elements before reading them) and its search trusts the graph or lists it read; inside a
// checksummed section those are FAISS's to check, and Load leaves them to FAISS and the CRC.
// The options ask for the header's dim (when it is 1 … 64, else 8) and for the factory the
// metadata names (when it is one of the real snapshots' factories, else "auto").
//
// Asserts, beyond no crash or undefined behaviour (ASan, UBSan):
// - a rejected file is DATA_LOSS (INVALID_ARGUMENT only for options the target derived badly);
// - a loaded index is usable and consistent: Documents() ascending and matching Stats(); a search
//   finds only its documents, best first; Remove and Add work on it;
// - round trip: Save and Load again give the same documents, stats and `covered` number.
//
// Speed: most mutants that load differ from an earlier one only where Load just carries a value
// along (the description, `covered`, flag bits other than trained) or inside a FAISS section that
// is replaced anyway. What the search and the writes do depends only on the rest — the options,
// the training state, the document table and the FAISS bytes — so those checks (about 20 ms an
// input under ASan: Remove compacts and rebuilds the FAISS index, and each exact search fills a
// scan buffer of megabytes) run once per distinct rest, remembered by its hash; Load, the
// consistency checks and the round trip run on every input. (A 30 s run loaded 44,542 inputs with
// 36 distinct rests: ~13,000 executions/s instead of ~300.)
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "index/candidate/candidate_index.h"
#include "index/common/crc32.h"
#include "tests/fuzz/candidate_snapshots.h"
#include "tests/fuzz/fuzz_util.h"

namespace tessera::fuzz {
namespace {

using internal::CandidateHit;
using internal::CandidateIndex;
using internal::CandidateIndexOptions;

constexpr size_t kHeaderSize = 40;

template <typename T>
T Load(const std::string& bytes, size_t at) {
  T value;
  std::memcpy(&value, bytes.data() + at, sizeof(T));
  return value;
}

template <typename T>
void Store(std::string* bytes, size_t at, T value) {
  std::memcpy(bytes->data() + at, &value, sizeof(T));
}

// Where the document table (its u64 count) and the FAISS section's u64 length sit, reading the
// payload as Load does.
struct Layout {
  size_t table = std::string::npos;
  size_t faiss_length = std::string::npos;  // npos when the metadata ends first
};

Layout LayoutOf(const std::string& file) {
  Layout layout;
  size_t at = kHeaderSize + 4;  // flags
  auto fits = [&](uint64_t n) { return file.size() >= at && file.size() - at >= n; };
  for (int text = 0; text < 2; ++text) {  // factory, description
    if (!fits(4)) return layout;
    const uint32_t n = Load<uint32_t>(file, at);
    at += 4;
    if (!fits(n)) return layout;
    at += n;
  }
  if (!fits(8)) return layout;
  layout.table = at;
  const uint64_t documents = Load<uint64_t>(file, at);
  at += 8;
  if (documents > (file.size() - at) / 16) return layout;
  at += documents * 16;
  if (fits(8)) layout.faiss_length = at;
  return layout;
}

size_t FaissLengthOffset(const std::string& file) { return LayoutOf(file).faiss_length; }

std::string FactoryOf(const std::string& file) {
  if (file.size() < kHeaderSize + 8) return "";
  const uint32_t n = Load<uint32_t>(file, kHeaderSize + 4);
  if (file.size() - kHeaderSize - 8 < n) return "";
  return file.substr(kHeaderSize + 8, n);
}

struct Section {
  std::string factory;
  std::string bytes;
};

// The FAISS sections of the real snapshots.
const std::vector<Section>& RealSections() {
  static const auto* const sections = [] {
    auto* out = new std::vector<Section>;
    for (const auto& [name, file] : CandidateSnapshots()) {
      const size_t at = FaissLengthOffset(file);
      FUZZ_CHECK(at != std::string::npos, "a real snapshot does not parse");
      out->push_back({FactoryOf(file), file.substr(at + 8)});
    }
    return out;
  }();
  return *sections;
}

// Splices a real FAISS section in (see the top of the file) and recomputes what the header only
// repeats: the payload length and the two checksums.
void GetPastChecksums(bool keep_length, std::string* file) {
  if (file->size() < kHeaderSize) return;
  const size_t at = FaissLengthOffset(*file);
  if (at != std::string::npos) {
    const std::string factory = FactoryOf(*file);
    const Section* section = &RealSections()[0];
    for (const Section& real : RealSections()) {
      if (real.factory == factory) {
        section = &real;
        break;
      }
    }
    const uint64_t length = keep_length ? Load<uint64_t>(*file, at) : section->bytes.size();
    file->resize(at);
    file->append(reinterpret_cast<const char*>(&length), 8);
    file->append(section->bytes);
  }
  const absl::string_view payload = absl::string_view(*file).substr(kHeaderSize);
  Store<uint64_t>(file, 24, payload.size());
  Store<uint32_t>(file, 32, internal::Crc32(payload));
  Store<uint32_t>(file, 36, internal::Crc32(absl::string_view(*file).substr(0, 36)));
}

CandidateIndexOptions OptionsFor(const std::string& file) {
  CandidateIndexOptions options;
  options.dim = 8;
  options.factory = "auto";
  if (file.size() < kHeaderSize) return options;
  const int64_t dim = Load<int64_t>(file, 8);
  if (dim >= 1 && dim <= 64) options.dim = dim;
  // A shard's options come from its validated schema: only factories FAISS builds.
  const std::string factory = FactoryOf(file);
  for (const Section& real : RealSections()) {
    if (real.factory == factory) options.factory = factory;
  }
  return options;
}

void CheckSearch(const CandidateIndex& index, int64_t dim, const std::vector<uint64_t>& documents) {
  std::vector<float> query(2 * dim);
  for (size_t i = 0; i < query.size(); ++i) query[i] = (i % 3 == 0) ? 0.5f : -0.25f;
  const absl::StatusOr<std::vector<std::vector<CandidateHit>>> hits =
      index.Search(FloatMatrixView{query.data(), 2, dim}, 5, nullptr, nullptr);
  FUZZ_CHECK(hits.ok(), hits.status().ToString());
  FUZZ_CHECK(hits->size() == 2, "one hit list per query row");
  for (const std::vector<CandidateHit>& row : *hits) {
    FUZZ_CHECK(row.size() <= 5, "more than k hits");
    for (size_t i = 0; i < row.size(); ++i) {
      FUZZ_CHECK(std::binary_search(documents.begin(), documents.end(), row[i].doc),
                 absl::StrCat("hit on document ", row[i].doc, " that the index does not hold"));
      if (i > 0) {
        FUZZ_CHECK(!(row[i].similarity > row[i - 1].similarity), "hits out of order");
      }
    }
  }
}

// True the first time a loaded file with this behaviour key is seen (see the top of the file): the
// options, the training state, and the payload from the document table on (the table, the FAISS
// section's length and bytes). `file` loaded, so its layout parses.
bool FirstWithThisBehaviour(const std::string& file, const CandidateIndexOptions& options,
                            bool trained) {
  // Hashes, not the keys: a 64-bit collision among the few thousand states a run reaches is
  // unlikely enough, and the set stays small. Bounded all the same: forgetting only costs time.
  static auto* const seen = new std::unordered_set<size_t>;
  const size_t table = LayoutOf(file).table;
  FUZZ_CHECK(table != std::string::npos, "a loaded file does not parse");
  std::string key = absl::StrCat(options.dim, " ", options.factory, " ", trained, " ");
  key.append(file, table, std::string::npos);
  if (seen->size() >= (size_t{1} << 20)) seen->clear();
  return seen->insert(std::hash<std::string_view>()(key)).second;
}

}  // namespace
}  // namespace tessera::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  using namespace tessera::fuzz;
  if (size == 0) return 0;
  std::string file(reinterpret_cast<const char*>(data + 1), size - 1);
  if (!(data[0] & 1)) GetPastChecksums(/*keep_length=*/(data[0] & 2) != 0, &file);
  const CandidateIndexOptions options = OptionsFor(file);
  static const std::string* const path = new std::string(ScratchDir() + "/candidates");
  WriteScratchFile(*path, file);

  auto loaded = CandidateIndex::Load(*path, options);
  if (!loaded.ok()) {
    FUZZ_CHECK(absl::IsDataLoss(loaded.status()) || absl::IsInvalidArgument(loaded.status()),
               loaded.status().ToString());
    return 0;
  }
  CandidateIndex& index = *loaded->first;
  const uint64_t covered = loaded->second;
  const std::vector<uint64_t> documents = index.Documents();
  FUZZ_CHECK(std::is_sorted(documents.begin(), documents.end()) &&
                 std::adjacent_find(documents.begin(), documents.end()) == documents.end(),
             "Documents() not ascending");
  const internal::CandidateIndexStats stats = index.Stats();
  FUZZ_CHECK(stats.documents == static_cast<int64_t>(documents.size()), "Stats().documents");
  const bool new_behaviour = FirstWithThisBehaviour(file, options, stats.trained);
  if (new_behaviour) CheckSearch(index, options.dim, documents);

  // Save and load again: the same index.
  static const std::string* const again_path = new std::string(ScratchDir() + "/candidates.again");
  const absl::Status saved = index.Save(*again_path, covered);
  FUZZ_CHECK(saved.ok(), saved.ToString());
  auto again = CandidateIndex::Load(*again_path, options);
  FUZZ_CHECK(again.ok(), again.status().ToString());
  FUZZ_CHECK(again->second == covered, "covered changed in the Save/Load round trip");
  FUZZ_CHECK(again->first->Documents() == documents, "documents changed in the round trip");
  const internal::CandidateIndexStats again_stats = again->first->Stats();
  FUZZ_CHECK(again_stats.vectors == stats.vectors && again_stats.description == stats.description &&
                 again_stats.trained == stats.trained,
             "stats changed in the round trip");

  // The loaded index takes writes.
  if (!new_behaviour) return 0;
  if (!documents.empty()) {
    FUZZ_CHECK(index.Remove(documents.front()).ok(), "Remove");
  }
  const uint64_t next = documents.empty() ? 1 : documents.back() + 1;
  if (next < (uint64_t{1} << 47)) {
    std::vector<float> vectors(2 * options.dim, 0.125f);
    vectors[0] = 1.0f;
    const absl::Status added = index.Add(next, FloatMatrixView{vectors.data(), 2, options.dim});
    FUZZ_CHECK(added.ok(), added.ToString());
  }
  std::vector<uint64_t> now = index.Documents();
  CheckSearch(index, options.dim, now);
  return 0;
}
