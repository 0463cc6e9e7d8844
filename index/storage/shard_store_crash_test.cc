// Crash safety of ShardStore: a child process writes a deterministic workload and reports every
// acknowledged Write() on a pipe; the parent SIGKILLs it at a random moment, reopens the store and
// checks that it holds exactly the state after all acknowledged batches (or after one more, the
// batch that was durable but not yet reported), byte for byte, with every column family
// consistent. Each of 4 chains crashes the same database 5 times, so that recovery of an already
// recovered database and the iid counter across crashes are covered too.
//
// The binary has its own main(): `shard_store_crash_test --crash_child DIR SEED START FD FLUSH` is
// the child mode (re-executed, not forked alone, so that RocksDB's threads start fresh in the
// child). FLUSH is the store's rerank_flush_bytes: the second test makes it small, so that the
// background thread moves rows into rerank segments and codes into codes segments, and rewrites
// them, while the child is killed. Every document carries codes of generation kGeneration, which
// its removal deletes (SetCodeGenerations), so the codes must end up exactly the live documents'.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "index/common/crc32.h"
#include "index/common/file_io.h"
#include "index/storage/record_codec.h"
#include "index/storage/rerank_segment.h"
#include "index/storage/rocksdb_tsan_suppressions.h"
#include "index/storage/shard_store.h"
#include "index/testing/temp_dir.h"
#include "rocksdb/db.h"

namespace tessera::internal {
namespace {

constexpr int kChains = 4;
constexpr int kCrashesPerChain = 5;
constexpr int kIdSpace = 150;
constexpr int64_t kMaxBatchesPerChild = 1000000;
constexpr uint32_t kGeneration = 3;

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t HashString(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a, identical in parent and child
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

// One batch of the workload: upserts (applied first, in order), then deletes.
struct Batch {
  std::vector<std::string> upserts;
  std::vector<std::string> deletes;
};

Batch MakeBatch(uint64_t seed, int64_t index) {
  std::mt19937_64 rng(Mix(seed ^ Mix(static_cast<uint64_t>(index))));
  Batch batch;
  const int ops = 1 + static_cast<int>(rng() % 20);
  for (int i = 0; i < ops; ++i) {
    std::string id = absl::StrCat("doc-", rng() % kIdSpace);
    if (rng() % 100 < 15) {
      batch.deletes.push_back(std::move(id));
    } else {
      batch.upserts.push_back(std::move(id));
    }
  }
  return batch;
}

// external id → version of the live document.
using State = std::map<std::string, uint64_t>;

// Applies `batch` to `state`; returns the version of each upsert.
std::vector<uint64_t> ApplyBatch(const Batch& batch, State* state) {
  std::vector<uint64_t> versions;
  for (const std::string& id : batch.upserts) {
    uint64_t& version = (*state)[id];
    version = version + 1;
    versions.push_back(version);
  }
  for (const std::string& id : batch.deletes) state->erase(id);
  return versions;
}

State StateAfter(uint64_t seed, int64_t batches) {
  State state;
  for (int64_t b = 0; b < batches; ++b) ApplyBatch(MakeBatch(seed, b), &state);
  return state;
}

StoredMatrix RandomMatrix(std::mt19937_64& rng, VectorDtype dtype, int64_t rows, int64_t cols) {
  StoredMatrix m;
  m.dtype = dtype;
  m.rows = rows;
  m.cols = cols;
  m.bytes.resize(rows * cols * DtypeSize(dtype));
  for (size_t i = 0; i < m.bytes.size(); i += 8) {
    const uint64_t word = rng();
    std::memcpy(&m.bytes[i], &word, std::min<size_t>(8, m.bytes.size() - i));
  }
  return m;
}

// The content of (id, version): deterministic, varied in size (a few are hundreds of KiB).
DocumentWrite Content(const std::string& id, uint64_t version) {
  std::mt19937_64 rng(Mix(HashString(id) ^ Mix(version)));
  DocumentWrite w;
  DocumentRecord& r = w.record;
  r.external_id = id;
  const int64_t cols = int64_t{32} << (rng() % 3);
  const int64_t rows = rng() % 16 == 0 ? 200 + static_cast<int64_t>(rng() % 1000)
                                       : 1 + static_cast<int64_t>(rng() % 40);
  r.num_tokens = rows * 2;
  if (rng() % 2 == 0) r.layout = PatchGridLayout{8, 8, 1, static_cast<int64_t>(rng() % 3)};
  r.attributes["version"] = static_cast<int64_t>(version);
  r.attributes["id"] = id;
  r.attributes["weight"] = static_cast<double>(rng() % 1000) / 8.0;
  for (int64_t v = 0; v <= rows; ++v) r.member_offsets.push_back(static_cast<int32_t>(2 * v));
  for (int64_t t = 0; t < 2 * rows; ++t) r.members.push_back(static_cast<int32_t>(t));
  w.rerank =
      RandomMatrix(rng, rng() % 2 == 0 ? VectorDtype::kFloat16 : VectorDtype::kFloat32, rows, cols);
  w.candidates = RandomMatrix(rng, VectorDtype::kFloat32, 1 + rng() % 4, cols);
  w.codes = RandomMatrix(rng, VectorDtype::kFloat32, 1, 1 + rows * 17).bytes;
  w.code_generation = kGeneration;
  return w;
}

ShardStoreOptions StoreOptions(int64_t flush_bytes) {
  ShardStoreOptions options;
  if (flush_bytes > 0) {
    options.rerank_flush_bytes = flush_bytes;
    options.rerank_segment_bytes = 4 * flush_bytes;
  }
  return options;
}

// Child mode: write batches START, START+1, ... and report each acknowledged one on FD.
int RunChild(const std::string& dir, uint64_t seed, int64_t start, int fd, int64_t flush_bytes) {
  auto store = ShardStore::Open(dir, StoreOptions(flush_bytes));
  if (!store.ok()) {
    std::cerr << "child: " << store.status() << "\n";
    return 3;
  }
  (*store)->SetCodeGenerations({kGeneration});
  State state = StateAfter(seed, start);
  if (write(fd, "R\n", 2) != 2) return 6;
  for (int64_t b = start; b < start + kMaxBatchesPerChild; ++b) {
    const Batch batch = MakeBatch(seed, b);
    State next = state;
    const std::vector<uint64_t> versions = ApplyBatch(batch, &next);
    std::vector<DocumentWrite> upserts;
    for (size_t i = 0; i < batch.upserts.size(); ++i) {
      upserts.push_back(Content(batch.upserts[i], versions[i]));
    }
    auto result = (*store)->Write(std::move(upserts), batch.deletes);
    if (!result.ok()) {
      std::cerr << "child: batch " << b << ": " << result.status() << "\n";
      return 4;
    }
    if (result->versions != versions) {
      std::cerr << "child: batch " << b << ": unexpected versions\n";
      return 5;
    }
    state = std::move(next);
    // One short write() per acknowledged batch: atomic on a pipe.
    const std::string line = absl::StrCat(b, "\n");
    if (write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return 6;
  }
  return 0;
}

struct ChildRun {
  int64_t last_acked = -1;  // -1: none
  bool killed = false;
  int exit_code = 0;
};

// Starts a child and SIGKILLs it `delay` after it has opened the store, or after it was started
// when `from_start` (then the kill may land in RocksDB's recovery or database creation).
ChildRun RunAndKill(const std::string& dir, uint64_t seed, int64_t start,
                    std::chrono::milliseconds delay, bool from_start, int64_t flush_bytes) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const std::string seed_arg = absl::StrCat(seed);
    const std::string start_arg = absl::StrCat(start);
    const std::string fd_arg = absl::StrCat(fds[1]);
    const std::string flush_arg = absl::StrCat(flush_bytes);
    execl("/proc/self/exe", "shard_store_crash_test", "--crash_child", dir.c_str(),
          seed_arg.c_str(), start_arg.c_str(), fd_arg.c_str(), flush_arg.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  if (!from_start) {
    // Wait (at most 30 s) for the child's "R" line.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (out.find("R\n") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fds[0], POLLIN, 0};
      if (poll(&p, 1, 100) > 0) {
        if ((n = read(fds[0], buf, sizeof(buf))) <= 0) break;
        out.append(buf, n);
      }
    }
    EXPECT_NE(out.find("R\n"), std::string::npos) << "the child did not open the store";
  }
  std::this_thread::sleep_for(delay);
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ChildRun run;
  run.killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fds[0]);
  size_t begin = 0;
  for (size_t end; (end = out.find('\n', begin)) != std::string::npos; begin = end + 1) {
    if (out.compare(begin, end - begin, "R") == 0) continue;
    const int64_t b = std::stoll(out.substr(begin, end - begin));
    EXPECT_EQ(b, run.last_acked < 0 ? start : run.last_acked + 1) << "reports out of order";
    run.last_acked = b;
  }
  return run;
}

// Everything the database holds, read behind the store's back (read-only), with every
// cross-CF invariant checked.
struct Scanned {
  std::map<std::string, DocumentRecord> docs;  // by external id
  std::map<uint64_t, StoredMatrix> rerank;
  std::map<uint64_t, StoredMatrix> candidates;
  std::map<uint64_t, std::string> codes;  // of kGeneration
  uint64_t next_iid = 0;
  int64_t rerank_pointers = 0;  // rerank values that point into a segment
  int64_t code_pointers = 0;    // codes values that point into a codes segment
};

void ScanAllColumnFamilies(const std::string& dir, Scanned* out) {
  std::vector<std::string> names;
  ASSERT_TRUE(rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), dir, &names).ok());
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const std::string& name : names) descriptors.emplace_back(name, rocksdb::Options());
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  const rocksdb::Status opened =
      rocksdb::DB::OpenForReadOnly(rocksdb::Options(), dir, descriptors, &handles, &raw);
  ASSERT_TRUE(opened.ok()) << opened.ToString();
  std::unique_ptr<rocksdb::DB> db(raw);
  std::map<std::string, rocksdb::ColumnFamilyHandle*> cf;
  for (size_t i = 0; i < names.size(); ++i) cf[names[i]] = handles[i];
  ASSERT_EQ(cf.count("meta") + cf.count("docs") + cf.count("ids") + cf.count("rerank") +
                cf.count("candidates") + cf.count("codes"),
            6u);

  auto scan = [&](const char* name,
                  const std::function<void(const std::string&, const std::string&)>& fn) {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), cf.at(name)));
    for (it->SeekToFirst(); it->Valid(); it->Next())
      fn(it->key().ToString(), it->value().ToString());
    EXPECT_TRUE(it->status().ok()) << it->status().ToString();
  };
  // Rerank values that point into a segment file are read from the file and checked against
  // the pointer's CRC; every segment file present must be committed (Open deletes the others).
  int64_t pointers = 0;
  auto rerank_matrix = [&](const std::string& value, uint64_t iid) -> absl::StatusOr<StoredMatrix> {
    if (!IsRerankPointer(value)) return DecodeStoredMatrix(value, "rerank", iid);
    ++pointers;
    auto pointer = DecodeRerankPointer(value, iid);
    if (!pointer.ok()) return pointer.status();
    std::string key = "s/rerank_segment/";
    for (int shift = 24; shift >= 0; shift -= 8)
      key.push_back(static_cast<char>(pointer->segment >> shift));
    std::string committed;
    if (!db->Get(rocksdb::ReadOptions(), cf.at("meta"), key, &committed).ok()) {
      return absl::DataLossError(
          absl::StrCat("iid ", iid, ": segment ", pointer->segment, " is not committed"));
    }
    auto file = ReadWholeFile(
        absl::StrCat(dir, "/", SegmentFileName(SegmentKind::kRerank, pointer->segment)));
    if (!file.ok()) return file.status();
    StoredMatrix m{pointer->dtype, pointer->rows, pointer->cols, {}};
    const size_t bytes = pointer->rows * pointer->cols * DtypeSize(pointer->dtype);
    if (pointer->offset + bytes > file->size()) return absl::DataLossError("outside the file");
    m.bytes = file->substr(pointer->offset, bytes);
    if (Crc32(m.bytes) != pointer->crc) return absl::DataLossError("checksum");
    return m;
  };
  int64_t code_pointers = 0;
  auto codes_value = [&](const std::string& value, uint64_t iid) -> absl::StatusOr<std::string> {
    if (!IsCodesPointer(value)) return DecodeCodesValue(value, kGeneration, iid);
    ++code_pointers;
    auto pointer = DecodeCodesPointer(value, kGeneration, iid);
    if (!pointer.ok()) return pointer.status();
    std::string key = "s/codes_segment/";
    for (int shift = 24; shift >= 0; shift -= 8)
      key.push_back(static_cast<char>(pointer->segment >> shift));
    std::string committed;
    if (!db->Get(rocksdb::ReadOptions(), cf.at("meta"), key, &committed).ok()) {
      return absl::DataLossError(
          absl::StrCat("iid ", iid, ": codes segment ", pointer->segment, " is not committed"));
    }
    auto file = ReadWholeFile(
        absl::StrCat(dir, "/", SegmentFileName(SegmentKind::kCodes, pointer->segment)));
    if (!file.ok()) return file.status();
    if (pointer->offset + pointer->bytes > file->size()) {
      return absl::DataLossError("outside the file");
    }
    std::string codes = file->substr(pointer->offset, pointer->bytes);
    if (Crc32(codes) != pointer->crc) return absl::DataLossError("checksum");
    return codes;
  };
  std::map<uint64_t, DocumentRecord> by_iid;
  scan("docs", [&](const std::string& key, const std::string& value) {
    uint64_t iid = 0;
    ASSERT_TRUE(DecodeIidKey(key, &iid));
    auto record = DecodeDocumentRecord(value, iid);
    ASSERT_TRUE(record.ok()) << record.status();
    by_iid[iid] = *record;
  });
  for (const char* name : {"rerank", "candidates"}) {
    scan(name, [&](const std::string& key, const std::string& value) {
      uint64_t iid = 0;
      ASSERT_TRUE(DecodeIidKey(key, &iid));
      auto matrix = std::strcmp(name, "rerank") == 0 ? rerank_matrix(value, iid)
                                                     : DecodeStoredMatrix(value, name, iid);
      ASSERT_TRUE(matrix.ok()) << matrix.status();
      EXPECT_EQ(by_iid.count(iid), 1u) << name << " row of iid " << iid << " without a docs row";
      (std::strcmp(name, "rerank") == 0 ? out->rerank : out->candidates)[iid] = *matrix;
    });
  }
  scan("codes", [&](const std::string& key, const std::string& value) {
    uint32_t generation = 0;
    uint64_t iid = 0;
    ASSERT_TRUE(DecodeCodesKey(key, &generation, &iid));
    ASSERT_EQ(generation, kGeneration);
    auto codes = codes_value(value, iid);
    ASSERT_TRUE(codes.ok()) << codes.status();
    EXPECT_EQ(by_iid.count(iid), 1u) << "codes of iid " << iid << " without a docs row";
    out->codes[iid] = *codes;
  });
  std::set<uint64_t> mapped;
  scan("ids", [&](const std::string& key, const std::string& value) {
    auto iid = DecodeIdValue(value, key);
    ASSERT_TRUE(iid.ok()) << iid.status();
    const auto doc = by_iid.find(*iid);
    ASSERT_NE(doc, by_iid.end()) << "ids entry '" << key << "' points to missing iid " << *iid;
    EXPECT_EQ(doc->second.external_id, key);
    EXPECT_TRUE(mapped.insert(*iid).second) << "two ids map to iid " << *iid;
  });
  for (const auto& [iid, record] : by_iid) {
    EXPECT_EQ(mapped.count(iid), 1u) << "docs row " << iid << " without an ids entry";
    EXPECT_EQ(out->rerank.count(iid), 1u) << "docs row " << iid << " without rerank vectors";
    EXPECT_EQ(out->candidates.count(iid), 1u) << "docs row " << iid << " without candidates";
    EXPECT_EQ(out->codes.count(iid), 1u) << "docs row " << iid << " without codes";
    EXPECT_TRUE(out->docs.emplace(record.external_id, record).second);
  }
  std::string value;
  if (db->Get(rocksdb::ReadOptions(), cf.at("meta"), "s/next_iid", &value).ok()) {
    auto next = DecodeCounterValue(value, "s/next_iid");
    ASSERT_TRUE(next.ok());
    out->next_iid = *next;
  }
  if (!by_iid.empty()) {
    EXPECT_GT(out->next_iid, by_iid.rbegin()->first);
  }
  if (db->Get(rocksdb::ReadOptions(), cf.at("meta"), "s/live_documents", &value).ok()) {
    auto live = DecodeCounterValue(value, "s/live_documents");
    ASSERT_TRUE(live.ok());
    EXPECT_EQ(*live, by_iid.size());
  } else {
    EXPECT_TRUE(by_iid.empty());
  }
  for (const SegmentKind kind : {SegmentKind::kRerank, SegmentKind::kCodes}) {
    const std::string prefix = absl::StrCat("s/", SegmentKindName(kind), "_segment/");
    std::set<uint32_t> committed;
    scan("meta", [&](const std::string& key, const std::string&) {
      if (key.rfind(prefix, 0) != 0 || key.size() != prefix.size() + 4) return;
      uint32_t number = 0;
      for (size_t b = prefix.size(); b < key.size(); ++b) {
        number = (number << 8) | static_cast<uint8_t>(key[b]);
      }
      committed.insert(number);
    });
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      uint32_t number = 0;
      if (ParseSegmentFileName(entry.path().filename().string(), kind, &number)) {
        EXPECT_EQ(committed.count(number), 1u) << "uncommitted segment " << entry.path();
      }
    }
  }
  out->rerank_pointers = pointers;
  out->code_pointers = code_pointers;
  for (auto* handle : handles) db->DestroyColumnFamilyHandle(handle);
}

bool SameMatrix(const StoredMatrix& a, const StoredMatrix& b) {
  return a.dtype == b.dtype && a.rows == b.rows && a.cols == b.cols && a.bytes == b.bytes;
}

// What RunChains saw over all reopens: values that pointed into a segment.
struct PointersSeen {
  int64_t rerank = 0;
  int64_t codes = 0;
};

// Runs the chains with the store's rerank_flush_bytes = flush_bytes (0: the default).
PointersSeen RunChains(int64_t flush_bytes) {
  PointersSeen pointers_seen;
  uint64_t master = std::random_device()();
  if (const char* env = getenv("TESSERA_CRASH_SEED")) master = std::strtoull(env, nullptr, 10);
  std::cout << "TESSERA_CRASH_SEED=" << master << "\n";
  std::mt19937_64 rng(master);
  const TempDir temp("shard_store_crash");
  const std::string& root = temp.path();

  int64_t total_acked = 0;
  int trials_with_progress = 0;
  for (int chain = 0; chain < kChains; ++chain) {
    const uint64_t seed = rng();
    const std::string dir = absl::StrCat(root, "/chain", chain);
    int64_t applied = 0;       // batches the database holds
    uint64_t min_new_iid = 1;  // iids created from now on must be at least this
    std::map<std::string, uint64_t> previous_iids;
    for (int crash = 0; crash < kCrashesPerChain; ++crash) {
      SCOPED_TRACE(absl::StrCat("seed ", master, ", chain ", chain, ", crash ", crash));
      const auto delay = std::chrono::milliseconds(5 + rng() % 196);
      // One run in four may die while opening (creating or recovering) the database.
      const bool from_start = rng() % 4 == 0;
      const ChildRun run = RunAndKill(dir, seed, applied, delay, from_start, flush_bytes);
      EXPECT_TRUE(run.killed) << "child exited with code " << run.exit_code;
      if (!run.killed) return pointers_seen;
      const int64_t acked = run.last_acked < 0 ? applied : run.last_acked + 1;
      total_acked += acked - applied;
      if (acked > applied) ++trials_with_progress;

      // Reopen through the store (this runs RocksDB's recovery) and read through its API.
      std::map<std::string, uint64_t> iids;
      {
        ShardStoreOptions options;
        options.rerank_flush_bytes = 0;  // nothing moves while the parent checks
        auto store = ShardStore::Open(dir, options);
        EXPECT_TRUE(store.ok()) << store.status();
        if (!store.ok()) return pointers_seen;
        const absl::Status status = (*store)->ForEachDocument([&](const DocumentRecord& r) {
          iids[r.external_id] = r.iid;
          auto looked_up = (*store)->LookupId(r.external_id);
          EXPECT_TRUE(looked_up.ok() && *looked_up == r.iid) << r.external_id;
          // The search's read and the checked copy agree with what was written.
          const DocumentWrite want = Content(r.external_id, r.version);
          auto copy = (*store)->GetRerank(r.iid);
          EXPECT_TRUE(copy.ok() && copy->bytes == want.rerank.bytes) << r.external_id;
          const uint64_t iid = r.iid;
          auto view = (*store)->ReadRerank(absl::MakeConstSpan(&iid, 1));
          EXPECT_TRUE(view.ok() && (*view)[0] != nullptr && (*view)[0]->bytes == want.rerank.bytes)
              << r.external_id;
          auto codes = (*store)->MultiGetCodes(kGeneration, absl::MakeConstSpan(&iid, 1));
          EXPECT_TRUE(codes.ok() && (*codes)[0].has_value() && *(*codes)[0] == want.codes)
              << r.external_id;
          auto in_place = (*store)->ReadCodes(kGeneration, absl::MakeConstSpan(&iid, 1));
          EXPECT_TRUE(in_place.ok() && (*in_place)[0] != nullptr && *(*in_place)[0] == want.codes)
              << r.external_id;
          return absl::OkStatus();
        });
        EXPECT_TRUE(status.ok()) << status;
        if (!status.ok()) return pointers_seen;
        EXPECT_EQ((*store)->Stats().documents, static_cast<int64_t>(iids.size()));
      }
      Scanned scanned;
      ScanAllColumnFamilies(dir, &scanned);
      if (::testing::Test::HasFatalFailure()) return pointers_seen;
      pointers_seen.rerank += scanned.rerank_pointers;
      pointers_seen.codes += scanned.code_pointers;

      // The state must be the one after `acked` batches, or after the next one (durable, killed
      // before it was reported).
      State actual;
      for (const auto& [id, record] : scanned.docs) actual[id] = record.version;
      int64_t recovered = -1;
      for (int64_t k : {acked, acked + 1}) {
        if (StateAfter(seed, k) == actual) recovered = k;
      }
      EXPECT_NE(recovered, -1) << "the recovered state is not the state after " << acked << " or "
                               << acked + 1 << " batches (" << actual.size() << " documents)";
      if (recovered == -1) return pointers_seen;
      for (const auto& [id, record] : scanned.docs) {
        const DocumentWrite want = Content(id, record.version);
        EXPECT_EQ(record.num_tokens, want.record.num_tokens) << id;
        EXPECT_EQ(record.attributes, want.record.attributes) << id;
        EXPECT_EQ(record.layout.has_value(), want.record.layout.has_value()) << id;
        if (record.layout.has_value()) {
          EXPECT_EQ(record.layout->suffix_tokens, want.record.layout->suffix_tokens) << id;
        }
        EXPECT_EQ(record.member_offsets, want.record.member_offsets) << id;
        EXPECT_EQ(record.members, want.record.members) << id;
        EXPECT_TRUE(SameMatrix(scanned.rerank.at(record.iid), want.rerank)) << id;
        EXPECT_TRUE(SameMatrix(scanned.candidates.at(record.iid), want.candidates)) << id;
        EXPECT_TRUE(scanned.codes.at(record.iid) == want.codes) << id;
        EXPECT_EQ(iids.at(id), record.iid) << id;
        // No iid is ever reused: a document written since the last check has a new, larger iid.
        const auto before = previous_iids.find(id);
        if (before == previous_iids.end() || before->second != record.iid) {
          EXPECT_GE(record.iid, min_new_iid) << id;
        }
      }
      std::cout << "chain " << chain << " crash " << crash << ": killed " << delay.count()
                << " ms after " << (from_start ? "start" : "open") << ", " << acked - applied
                << " batches acknowledged, recovered " << recovered - applied << ", "
                << actual.size() << " documents, " << scanned.rerank_pointers
                << " in rerank segments, " << scanned.code_pointers << " codes in segments\n";
      applied = recovered;
      previous_iids = iids;
      min_new_iid = std::max(min_new_iid, scanned.next_iid);
    }
  }
  std::cout << total_acked << " batches acknowledged in " << trials_with_progress << " of "
            << kChains * kCrashesPerChain << " runs\n";
  // Most runs must have made progress, or the test tests nothing.
  EXPECT_GE(trials_with_progress, kChains * kCrashesPerChain / 2);
  return pointers_seen;
}

TEST(ShardStoreCrash, AcknowledgedWritesSurviveSigkill) { RunChains(0); }

// The same with the background flush moving rows into rerank segments and codes into codes
// segments (and rewriting segments as deletes and replacements kill their rows and codes) every
// few KiB: a kill lands before, during and after segment commits, and every acknowledged
// document's rows and codes must still read back byte for byte, stored once.
TEST(ShardStoreCrash, AcknowledgedWritesSurviveSigkillDuringSegmentFlush) {
  const PointersSeen pointers = RunChains(16 << 10);
  // Rows and codes did move into segments, or the test tests nothing new.
  EXPECT_GT(pointers.rerank, 0);
  EXPECT_GT(pointers.codes, 0);
}

}  // namespace
}  // namespace tessera::internal

int main(int argc, char** argv) {
  if (argc == 7 && std::strcmp(argv[1], "--crash_child") == 0) {
    return tessera::internal::RunChild(
        argv[2], std::strtoull(argv[3], nullptr, 10), std::strtoll(argv[4], nullptr, 10),
        static_cast<int>(std::strtol(argv[5], nullptr, 10)), std::strtoll(argv[6], nullptr, 10));
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
