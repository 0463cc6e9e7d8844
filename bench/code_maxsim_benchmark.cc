// Stage 2 from residual codes: the compact MaxSim kernel (index/centroid/code_maxsim.h, scores from
// centroid ids + codes without decoding) against the path it replaces, decoding every candidate
// document to fp32 (centroid + decoded residual, as CentroidCodebook::Decode) and scoring with the
// CPU MaxSim scorer (tessera/maxsim.h, best ISA).
//
// Workload: a 32 × 128 query against 1,000 documents of 64 tokens, nbits 4 and 2, a codebook of
// 8,192 centroids (stage 1's 32 × 8,192 centroid score table, 1 MiB, is an input both paths have);
// the compact benchmarks also at 27 tokens (one block, not full: the short set's documents) and 96
// (an odd count of blocks). One thread throughout.
//
// Benchmark names, in the order they run:
//   BM_DecodeThenMaxSim/nbits:{4,2}     decode + fp32 MaxSim; counter docs_per_s
//   BM_Fp32MaxSimOnly/nbits:{4,2}       the fp32 MaxSim of already decoded documents (no decode)
//   BM_CompactMaxSim/nbits:{4,2}/{avx512,avx2,portable}/doc_tokens:{64,27,96}
//   BM_CompactLayout/nbits:{4,2}/doc_tokens:{64,27,96}
//                                       CompactDocuments::Add of the 1,000 documents; docs_per_s
//   BM_StoredCodesMaxSim/nbits:{4,2}/doc_tokens:{64,27,96}
//                                       ScoreStoredCodes (layout + scoring, best ISA): stage 2's
//                                       path
//   BM_Int8VnniPrototype/nbits:{4,2}    the design the compact kernel was chosen over (below)
//   BM_CentroidTable/centroids:{32768,2048}/dim:{128,384}/used:{100,70,60,30}
//                                       stage 2's query × centroid table (32 query rows): all of
//                                       it, or the used share of its rows; centroids_per_s
//   BM_ScanBlocks/{avx512,avx2,portable}/code_bytes:{32,96}
//                                       stage 1's scan of one inverted list (2,048 entries, ~the
//                                       1M-document shard's lists) for one query row: 2-bit codes
//                                       at dim 128 (the scale shards) and 384 (the real sets);
//                                       entries_per_s and code_bytes_per_s
// BM_CompactMaxSim and BM_Int8VnniPrototype report docs_per_s, vs_decode (docs_per_s /
// BM_DecodeThenMaxSim's at the same nbits, 64-token documents only), max_err (the largest |score −
// double-precision MaxSim of the decoded vectors| over the first 100 documents) and bound (the
// worst-case error the design guarantees). Each compact or int8 iteration includes preparing the
// query (the quantised tables of its 32 rows). Rates are per CPU second of the benchmark thread
// (ThreadCpuSeconds). An ISA the CPU lacks is reported as an error for that benchmark.
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#include "benchmark/benchmark.h"
#include "index/centroid/code_maxsim.h"
#include "index/centroid/code_scan_kernels.h"
#include "index/centroid/residual_codec.h"
#include "index/common/cpu_features.h"
#include "index/kernels/cpu_kernels.h"
#include "index/kernels/query_similarity.h"
#include "tessera/maxsim.h"

namespace tessera::internal {
namespace {

constexpr int64_t kQueryTokens = 32;
constexpr int64_t kDim = 128;
constexpr int64_t kDocs = 1000;
constexpr int64_t kDocTokens = 64;
// The compact benchmarks' document lengths: the default, one block not full, an odd count of
// blocks.
constexpr int64_t kCompactDocTokens[] = {kDocTokens, 27, 96};
constexpr int64_t kCentroids = 8192;

double g_decode_docs_per_s[5] = {0, 0, 0, 0, 0};  // by nbits
double g_compact_docs_per_s[5][4] = {};           // by nbits and CpuIsa

struct Workload {
  std::unique_ptr<ResidualCodec> codec;
  int64_t doc_tokens = kDocTokens;
  std::vector<float> query;            // kQueryTokens × kDim
  std::vector<float> centroids;        // kCentroids × kDim
  std::vector<float> centroid_scores;  // kQueryTokens × kCentroids
  std::vector<uint32_t> ids;           // kDocs × doc_tokens
  std::vector<uint8_t> codes;          // kDocs × doc_tokens × code_bytes
  std::unique_ptr<CompactDocuments> compact;

  // Document d's ids and codes as the store's view of them.
  DocumentCodesView Stored(int64_t d) const {
    return DocumentCodesView{doc_tokens, reinterpret_cast<const char*>(&ids[d * doc_tokens]),
                             &codes[d * doc_tokens * codec->code_bytes()]};
  }
};

// The workload of `nbits` and documents of `doc_tokens` tokens (built once per pair).
const Workload& GetWorkload(int nbits, int64_t doc_tokens = kDocTokens) {
  static auto* workloads = new std::map<std::pair<int, int64_t>, std::unique_ptr<Workload>>;
  std::unique_ptr<Workload>& slot = (*workloads)[{nbits, doc_tokens}];
  if (slot != nullptr) return *slot;
  auto* w = new Workload;
  w->doc_tokens = doc_tokens;
  std::mt19937 rng(42);
  std::normal_distribution<float> normal;
  std::vector<float> training(4096 * kDim);
  for (float& v : training) v = 0.2f * normal(rng);
  w->codec =
      std::make_unique<ResidualCodec>(*ResidualCodec::Train(training.data(), 4096, kDim, nbits));
  w->query.resize(kQueryTokens * kDim);
  for (float& v : w->query) v = normal(rng) / 11.3f;
  w->centroids.resize(kCentroids * kDim);
  for (float& v : w->centroids) v = normal(rng) / 11.3f;
  w->centroid_scores.resize(kQueryTokens * kCentroids);
  for (int64_t i = 0; i < kQueryTokens; ++i) {
    for (int64_t c = 0; c < kCentroids; ++c) {
      float s = 0;
      for (int64_t d = 0; d < kDim; ++d) s += w->query[i * kDim + d] * w->centroids[c * kDim + d];
      w->centroid_scores[i * kCentroids + c] = s;
    }
  }
  const int64_t code_bytes = w->codec->code_bytes();
  std::uniform_int_distribution<uint32_t> pick(0, kCentroids - 1);
  std::uniform_int_distribution<int> byte(0, 255);
  w->ids.resize(kDocs * doc_tokens);
  for (uint32_t& id : w->ids) id = pick(rng);
  w->codes.resize(kDocs * doc_tokens * code_bytes);
  for (uint8_t& b : w->codes) b = static_cast<uint8_t>(byte(rng));
  w->compact = std::make_unique<CompactDocuments>(code_bytes);
  for (int64_t d = 0; d < kDocs; ++d) w->compact->Add(w->Stored(d));
  slot.reset(w);
  return *w;
}

// ---- The alternative the kernel was chosen over, measured here: NextPlaid's form, an int8 query
// times uint8 per-dimension residual weights, on AVX-512 VNNI (+ VBMI for the decode). Each
// dimension's 2^nbits weights become w ≈ o_d + s_d · u (u ∈ [0, 255]); the query row folds s_d in
// and is rounded to int8 (scale sq_i = max_d |q_i[d] · s_d| / 127); ⟨q_i, r⟩ ≈ Σ_d q_i[d] · o_d +
// sq_i · Σ_d q8_i[d] · u_d[code_d]. A document's codes are decoded to u bytes (one vpermb per 16
// tokens × 4 dimensions, the four dimensions' tables in one 64-byte register), then vpdpbusd
// does 64 multiply-adds per instruction. Worst case per query row: Σ_d |q_i[d]| · s_d / 2 (the
// weights' rounding) + dim · 255 · sq_i / 2 (the query's). A benchmark-only prototype: dim a
// multiple of 8, nq a multiple of 16.
struct Int8Query {
  int64_t groups = 0;              // dim / 4
  std::vector<int32_t> q8;         // nq × groups: four int8 per int32
  std::vector<uint8_t> tables;     // groups × 64: table[16p + v] = u_{4g+p}[v]
  std::vector<float> scale, bias;  // nq
  double bound = 0;
};

Int8Query PrepareInt8(const ResidualCodec& codec, const float* q, int64_t nq) {
  const int64_t dim = codec.dim();
  const int buckets = 1 << codec.nbits();
  Int8Query out;
  out.groups = dim / 4;
  std::vector<float> s(dim), o(dim);
  out.tables.assign(out.groups * 64, 0);
  for (int64_t d = 0; d < dim; ++d) {
    const float* w = codec.weights(d);
    const float lo = *std::min_element(w, w + buckets), hi = *std::max_element(w, w + buckets);
    o[d] = lo;
    s[d] = hi > lo ? (hi - lo) / 255.0f : 1.0f;
    for (int v = 0; v < buckets; ++v) {
      out.tables[(d / 4) * 64 + 16 * (d % 4) + v] =
          static_cast<uint8_t>(std::clamp(std::nearbyint((w[v] - lo) / s[d]), 0.0f, 255.0f));
    }
  }
  out.q8.resize(nq * out.groups);
  out.scale.resize(nq);
  out.bias.resize(nq);
  for (int64_t i = 0; i < nq; ++i) {
    float m = 0, bias = 0;
    double weight_error = 0;
    for (int64_t d = 0; d < dim; ++d) {
      m = std::max(m, std::fabs(q[i * dim + d] * s[d]));
      bias += q[i * dim + d] * o[d];
      weight_error += std::fabs(q[i * dim + d]) * s[d] / 2;
    }
    const float sq = m > 0 ? m / 127.0f : 1.0f;
    auto* bytes = reinterpret_cast<int8_t*>(&out.q8[i * out.groups]);
    for (int64_t d = 0; d < dim; ++d) {
      bytes[d] = static_cast<int8_t>(std::nearbyint(q[i * dim + d] * s[d] / sq));
    }
    out.scale[i] = sq;
    out.bias[i] = bias;
    out.bound += weight_error + static_cast<double>(dim) * 255 * sq / 2;
  }
  return out;
}

// 16 tokens' code nibbles (nbits 4: x = byte 2g | byte 2g+1 << 8; nbits 2: x = byte g) → vpermb
// indices 16p + (bits of dimension 4g + p).
__attribute__((target("avx512f,avx512bw"))) __m512i SpreadNibbles(__m512i x, int nbits) {
  __m512i y;
  if (nbits == 4) {
    const __m512i z = _mm512_and_si512(_mm512_or_si512(x, _mm512_slli_epi32(x, 8)),
                                       _mm512_set1_epi32(0x00ff00ff));
    y = _mm512_and_si512(_mm512_or_si512(z, _mm512_slli_epi32(z, 4)),
                         _mm512_set1_epi32(0x0f0f0f0f));
  } else {
    y = _mm512_or_si512(
        _mm512_or_si512(_mm512_and_si512(x, _mm512_set1_epi32(0x3)),
                        _mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0xc)), 6)),
        _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0x30)), 12),
                        _mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0xc0)), 18)));
  }
  return _mm512_or_si512(y, _mm512_set1_epi32(0x30201000));
}

__attribute__((target("avx512f,avx512bw,avx512vnni,avx512vbmi"))) void ScoreInt8Vnni(
    const Int8Query& query, int nbits, int64_t nq, const float* centroid_scores,
    int64_t centroid_stride, const CompactDocument* docs, int64_t num_docs, float* scores) {
  constexpr int kRows = 16;
  const int64_t groups = query.groups;
  const int64_t code_bytes = groups * 4 * nbits / 8;
  struct alignas(64) Decoded {
    uint8_t bytes[64];
  };
  std::vector<Decoded> decoded;
  std::vector<float> best(nq);
  for (int64_t doc_index = 0; doc_index < num_docs; ++doc_index) {
    const CompactDocument& doc = docs[doc_index];
    const int64_t chunks = (doc.num_tokens + 15) / 16;
    decoded.resize(chunks * groups);
    for (int64_t c = 0; c < chunks; ++c) {
      const uint8_t* block = doc.blocks + (c / 2) * code_bytes * 32 + (c % 2) * 16;
      for (int64_t g = 0; g < groups; ++g) {
        __m512i x;
        if (nbits == 4) {
          const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2 * g * 32));
          const __m128i r1 =
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + (2 * g + 1) * 32));
          x = _mm512_cvtepu16_epi32(
              _mm256_set_m128i(_mm_unpackhi_epi8(r0, r1), _mm_unpacklo_epi8(r0, r1)));
        } else {
          x = _mm512_cvtepu8_epi32(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + g * 32)));
        }
        _mm512_store_si512(decoded[c * groups + g].bytes,
                           _mm512_permutexvar_epi8(SpreadNibbles(x, nbits),
                                                   _mm512_loadu_si512(&query.tables[g * 64])));
      }
    }
    for (int64_t i0 = 0; i0 < nq; i0 += kRows) {
      for (int r = 0; r < kRows; ++r) best[i0 + r] = -INFINITY;
      for (int64_t c = 0; c < chunks; ++c) {
        __m512i acc[kRows];
        for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_si512();
        for (int64_t g = 0; g < groups; ++g) {
          const __m512i data = _mm512_load_si512(decoded[c * groups + g].bytes);
#pragma GCC unroll 16
          for (int r = 0; r < kRows; ++r) {
            acc[r] = _mm512_dpbusd_epi32(acc[r], data,
                                         _mm512_set1_epi32(query.q8[(i0 + r) * groups + g]));
          }
        }
        const int64_t valid = std::min<int64_t>(16, doc.num_tokens - c * 16);
        const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
        const __m512i ids = _mm512_maskz_loadu_epi32(mask, doc.centroid_ids + c * 16);
        for (int r = 0; r < kRows; ++r) {
          const float* row = centroid_scores + (i0 + r) * centroid_stride;
          const __m512 centroid =
              _mm512_mask_i32gather_ps(_mm512_set1_ps(-INFINITY), mask, ids, row, 4);
          const __m512 s = _mm512_add_ps(
              centroid,
              _mm512_mul_ps(_mm512_set1_ps(query.scale[i0 + r]), _mm512_cvtepi32_ps(acc[r])));
          best[i0 + r] = std::max(best[i0 + r], _mm512_reduce_max_ps(s));
        }
      }
    }
    float total = 0;
    for (int64_t i = 0; i < nq; ++i) total += best[i] + query.bias[i];
    scores[doc_index] = total;
  }
}

// This thread's CPU time: the machines these run on are shared, and every path here runs on the
// calling thread only, so CPU seconds compare the paths where wall seconds would add others' load.
double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Double-precision MaxSim of document d's decoded vectors.
double ReferenceScore(const Workload& w, int64_t d) {
  std::vector<float> v(kDim);
  const int64_t code_bytes = w.codec->code_bytes();
  double total = 0;
  std::vector<double> best(kQueryTokens, -INFINITY);
  for (int64_t t = 0; t < w.doc_tokens; ++t) {
    const int64_t token = d * w.doc_tokens + t;
    w.codec->Decode(&w.codes[token * code_bytes], v.data());
    for (int64_t k = 0; k < kDim; ++k) v[k] += w.centroids[w.ids[token] * kDim + k];
    for (int64_t i = 0; i < kQueryTokens; ++i) {
      double s = 0;
      for (int64_t k = 0; k < kDim; ++k) s += static_cast<double>(w.query[i * kDim + k]) * v[k];
      best[i] = std::max(best[i], s);
    }
  }
  for (const double b : best) total += b;
  return total;
}

// The largest |score − reference| over the first kCheckedDocs documents.
constexpr int64_t kCheckedDocs = 100;
double MaxError(const Workload& w, const std::vector<float>& scores) {
  double worst = 0;
  for (int64_t d = 0; d < kCheckedDocs; ++d) {
    worst = std::max(worst, std::fabs(scores[d] - ReferenceScore(w, d)));
  }
  return worst;
}

std::unique_ptr<MaxSimScorer> Fp32Scorer() {
  return *NewCpuMaxSimScorer(CpuMaxSimOptions{CpuIsa::kAuto, /*num_threads=*/1});
}

// Decodes every document (codec + centroid, as CentroidCodebook::Decode) into `values`.
void DecodeAll(const Workload& w, std::vector<float>* values) {
  const int64_t code_bytes = w.codec->code_bytes();
  for (int64_t v = 0; v < kDocs * kDocTokens; ++v) {
    float* out = &(*values)[v * kDim];
    w.codec->Decode(&w.codes[v * code_bytes], out);
    const float* centroid = &w.centroids[static_cast<int64_t>(w.ids[v]) * kDim];
    for (int64_t k = 0; k < kDim; ++k) out[k] += centroid[k];
  }
}

std::vector<DocumentRef> Refs(const std::vector<float>& values) {
  std::vector<DocumentRef> refs(kDocs);
  for (int64_t d = 0; d < kDocs; ++d) refs[d] = {&values[d * kDocTokens * kDim], kDocTokens};
  return refs;
}

void BM_DecodeThenMaxSim(benchmark::State& state, int nbits) {
  const Workload& w = GetWorkload(nbits);
  const std::unique_ptr<MaxSimScorer> scorer = Fp32Scorer();
  std::vector<float> values(kDocs * kDocTokens * kDim);
  const std::vector<DocumentRef> refs = Refs(values);
  const FloatMatrixView query{w.query.data(), kQueryTokens, kDim};
  const double start = ThreadCpuSeconds();
  for (auto _ : state) {
    DecodeAll(w, &values);
    absl::StatusOr<MaxSimResult> result =
        scorer->Score(query, DocumentBatch{VectorDtype::kFloat32, kDim, refs});
    benchmark::DoNotOptimize(result->scores.data());
  }
  g_decode_docs_per_s[nbits] = state.iterations() * kDocs / (ThreadCpuSeconds() - start);
  state.counters["docs_per_s"] = g_decode_docs_per_s[nbits];
  state.SetLabel(std::string(scorer->name()));
}

void BM_Fp32MaxSimOnly(benchmark::State& state, int nbits) {
  const Workload& w = GetWorkload(nbits);
  const std::unique_ptr<MaxSimScorer> scorer = Fp32Scorer();
  std::vector<float> values(kDocs * kDocTokens * kDim);
  DecodeAll(w, &values);
  const std::vector<DocumentRef> refs = Refs(values);
  const FloatMatrixView query{w.query.data(), kQueryTokens, kDim};
  const double start = ThreadCpuSeconds();
  for (auto _ : state) {
    absl::StatusOr<MaxSimResult> result =
        scorer->Score(query, DocumentBatch{VectorDtype::kFloat32, kDim, refs});
    benchmark::DoNotOptimize(result->scores.data());
  }
  state.counters["docs_per_s"] = state.iterations() * kDocs / (ThreadCpuSeconds() - start);
  state.SetLabel(std::string(scorer->name()));
}

void BM_CompactMaxSim(benchmark::State& state, int nbits, CpuIsa isa, int64_t doc_tokens) {
  if (!CpuSupportsIsa(isa)) {
    state.SkipWithError(absl::StrCat("this CPU lacks ", CpuIsaName(isa)).c_str());
    return;
  }
  const Workload& w = GetWorkload(nbits, doc_tokens);
  const std::vector<CompactDocument> docs = w.compact->refs();
  std::vector<float> scores(kDocs);
  const double start = ThreadCpuSeconds();
  for (auto _ : state) {
    const CompactQuery query(*w.codec, w.query.data(), kQueryTokens, w.centroid_scores.data(),
                             kCentroids);
    if (!ScoreCompactDocuments(query, docs, scores.data(), isa).ok()) {
      state.SkipWithError("ScoreCompactDocuments failed");
      return;
    }
    benchmark::DoNotOptimize(scores.data());
  }
  const double docs_per_s = state.iterations() * kDocs / (ThreadCpuSeconds() - start);
  state.counters["docs_per_s"] = docs_per_s;
  if (doc_tokens == kDocTokens) g_compact_docs_per_s[nbits][static_cast<int>(isa)] = docs_per_s;
  const CompactQuery query(*w.codec, w.query.data(), kQueryTokens, w.centroid_scores.data(),
                           kCentroids);
  state.counters["max_err"] = MaxError(w, scores);
  state.counters["bound"] = query.ErrorBound();
  if (g_decode_docs_per_s[nbits] > 0 && doc_tokens == kDocTokens) {
    state.counters["vs_decode"] = docs_per_s / g_decode_docs_per_s[nbits];
  }
}

// Building the compact layout from row-major codes (what a caller holding a document's stored
// codes does before BM_CompactMaxSim): CompactDocuments::Add of every document.
void BM_CompactLayout(benchmark::State& state, int nbits, int64_t doc_tokens) {
  const Workload& w = GetWorkload(nbits, doc_tokens);
  const int64_t code_bytes = w.codec->code_bytes();
  const double start = ThreadCpuSeconds();
  for (auto _ : state) {
    CompactDocuments docs(code_bytes);
    for (int64_t d = 0; d < kDocs; ++d) {
      docs.Add(w.Stored(d));
    }
    benchmark::DoNotOptimize(docs.refs().data());
  }
  state.counters["docs_per_s"] = state.iterations() * kDocs / (ThreadCpuSeconds() - start);
}

// What stage 2 runs: ScoreStoredCodes from the documents' stored (row-major) codes, laid out and
// scored batch by batch, best ISA; vs_compact is docs_per_s over BM_CompactMaxSim's at the same
// nbits and ISA (the layout's share).
void BM_StoredCodesMaxSim(benchmark::State& state, int nbits, int64_t doc_tokens) {
  const Workload& w = GetWorkload(nbits, doc_tokens);
  std::vector<DocumentCodesView> docs;
  for (int64_t d = 0; d < kDocs; ++d) docs.push_back(w.Stored(d));
  std::vector<float> scores(kDocs);
  const double start = ThreadCpuSeconds();
  for (auto _ : state) {
    const CompactQuery query(*w.codec, w.query.data(), kQueryTokens, w.centroid_scores.data(),
                             kCentroids);
    if (!ScoreStoredCodes(query, docs, scores.data()).ok()) {
      state.SkipWithError("ScoreStoredCodes failed");
      return;
    }
    benchmark::DoNotOptimize(scores.data());
  }
  const double docs_per_s = state.iterations() * kDocs / (ThreadCpuSeconds() - start);
  state.counters["docs_per_s"] = docs_per_s;
  state.counters["max_err"] = MaxError(w, scores);
  const double compact = g_compact_docs_per_s[nbits][static_cast<int>(DetectCpuIsa())];
  if (compact > 0 && doc_tokens == kDocTokens) state.counters["vs_compact"] = docs_per_s / compact;
}

void BM_Int8VnniPrototype(benchmark::State& state, int nbits) {
  if (!Cpu().avx512vnni || !Cpu().avx512vbmi) {
    state.SkipWithError("this CPU lacks AVX-512 VNNI or VBMI");
    return;
  }
  const Workload& w = GetWorkload(nbits);
  const std::vector<CompactDocument> docs = w.compact->refs();
  std::vector<float> scores(kDocs);
  const double start = ThreadCpuSeconds();
  for (auto _ : state) {
    const Int8Query query = PrepareInt8(*w.codec, w.query.data(), kQueryTokens);
    ScoreInt8Vnni(query, nbits, kQueryTokens, w.centroid_scores.data(), kCentroids, docs.data(),
                  kDocs, scores.data());
    benchmark::DoNotOptimize(scores.data());
  }
  const double docs_per_s = state.iterations() * kDocs / (ThreadCpuSeconds() - start);
  state.counters["docs_per_s"] = docs_per_s;
  state.counters["max_err"] = MaxError(w, scores);
  state.counters["bound"] = PrepareInt8(*w.codec, w.query.data(), kQueryTokens).bound;
  if (g_decode_docs_per_s[nbits] > 0) {
    state.counters["vs_decode"] = docs_per_s / g_decode_docs_per_s[nbits];
  }
}

// Stage 1's kernel (code_scan_kernels.h): the 16-bit sums of one list's blocks for one query row's
// tables, the list and tables resident in cache as in a search (a token scans its probed lists one
// after another with one set of tables).
void BM_ScanBlocks(benchmark::State& state, CpuIsa isa, int64_t code_bytes) {
  if (!CpuSupportsIsa(isa)) {
    state.SkipWithError(absl::StrCat("this CPU lacks ", CpuIsaName(isa)).c_str());
    return;
  }
  constexpr int64_t kListBlocks = 64;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> blocks(kListBlocks * code_bytes * kScanBlockEntries);
  for (uint8_t& b : blocks) b = static_cast<uint8_t>(byte(rng));
  // Levels small enough for 2 · code_bytes nibbles to sum within 16 bits, as QuantizeScanTables'.
  std::uniform_int_distribution<int> level(0, 127);
  std::vector<uint8_t> tables(2 * code_bytes * 16);
  for (uint8_t& t : tables) t = static_cast<uint8_t>(level(rng));
  std::vector<uint16_t> sums(kListBlocks * kScanBlockEntries);
  auto scan = isa == CpuIsa::kAvx512 ? ScanBlocksAvx512
              : isa == CpuIsa::kAvx2 ? ScanBlocksAvx2
                                     : ScanBlocksPortable;
  const double start = ThreadCpuSeconds();
  for (auto _ : state) {
    scan(blocks.data(), kListBlocks, code_bytes, tables.data(), sums.data());
    benchmark::DoNotOptimize(sums.data());
  }
  const double entries = static_cast<double>(state.iterations()) * kListBlocks * kScanBlockEntries;
  const double seconds = ThreadCpuSeconds() - start;
  state.counters["entries_per_s"] = entries / seconds;
  state.counters["code_bytes_per_s"] = entries * static_cast<double>(code_bytes) / seconds;
}

// Stage 2's query × centroid table when stage 1 kept none: every centroid of a codebook
// (QuerySimilarity::Compute, the whole table) against the `used_percent` of them a batch of
// candidates' codes name, scattered at random (ComputeRows). 32,768 centroids at dim 128: the 1M
// scale shard's codebook (its 553 default candidates of 64 vectors use ~60%); 2,048 at dim 384:
// the real sets' (~70% used by the short set's 100 candidates of ~26 vectors).
void BM_CentroidTable(benchmark::State& state, int64_t centroids, int64_t dim, int used_percent) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal;
  std::vector<float> rows(centroids * dim);
  for (float& v : rows) v = normal(rng) / 11.3f;
  std::vector<float> query(kQueryTokens * dim);
  for (float& v : query) v = normal(rng) / 11.3f;
  const QuerySimilarity similarity({query.data(), kQueryTokens, dim});
  std::vector<uint32_t> ids;
  std::bernoulli_distribution used(used_percent / 100.0);
  for (int64_t c = 0; c < centroids; ++c) {
    if (used(rng)) ids.push_back(static_cast<uint32_t>(c));
  }
  std::vector<float> table(centroids * similarity.stride());
  const double start = ThreadCpuSeconds();
  for (auto _ : state) {
    if (used_percent == 100) {
      similarity.Compute(rows.data(), centroids, table.data());
    } else {
      similarity.ComputeRows(rows.data(), ids, table.data());
    }
    benchmark::DoNotOptimize(table.data());
  }
  const double scored = static_cast<double>(state.iterations()) *
                        (used_percent == 100 ? centroids : static_cast<double>(ids.size()));
  state.counters["centroids_per_s"] = scored / (ThreadCpuSeconds() - start);
}

const bool kRegistered = [] {
  for (const int nbits : {4, 2}) {
    benchmark::RegisterBenchmark(absl::StrCat("BM_DecodeThenMaxSim/nbits:", nbits).c_str(),
                                 BM_DecodeThenMaxSim, nbits)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(absl::StrCat("BM_Fp32MaxSimOnly/nbits:", nbits).c_str(),
                                 BM_Fp32MaxSimOnly, nbits)
        ->Unit(benchmark::kMillisecond);
    for (const int64_t doc_tokens : kCompactDocTokens) {
      for (const CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2, CpuIsa::kPortable}) {
        benchmark::RegisterBenchmark(absl::StrCat("BM_CompactMaxSim/nbits:", nbits, "/",
                                                  CpuIsaName(isa), "/doc_tokens:", doc_tokens)
                                         .c_str(),
                                     BM_CompactMaxSim, nbits, isa, doc_tokens)
            ->Unit(benchmark::kMillisecond);
      }
    }
    for (const int64_t doc_tokens : kCompactDocTokens) {
      benchmark::RegisterBenchmark(
          absl::StrCat("BM_CompactLayout/nbits:", nbits, "/doc_tokens:", doc_tokens).c_str(),
          BM_CompactLayout, nbits, doc_tokens)
          ->Unit(benchmark::kMillisecond);
    }
    for (const int64_t doc_tokens : kCompactDocTokens) {
      benchmark::RegisterBenchmark(
          absl::StrCat("BM_StoredCodesMaxSim/nbits:", nbits, "/doc_tokens:", doc_tokens).c_str(),
          BM_StoredCodesMaxSim, nbits, doc_tokens)
          ->Unit(benchmark::kMillisecond);
    }
    benchmark::RegisterBenchmark(absl::StrCat("BM_Int8VnniPrototype/nbits:", nbits).c_str(),
                                 BM_Int8VnniPrototype, nbits)
        ->Unit(benchmark::kMillisecond);
  }
  for (const auto& [centroids, dim] : {std::pair<int64_t, int64_t>{32768, 128}, {2048, 384}}) {
    for (const int used_percent : {100, 70, 60, 30}) {
      benchmark::RegisterBenchmark(absl::StrCat("BM_CentroidTable/centroids:", centroids,
                                                "/dim:", dim, "/used:", used_percent)
                                       .c_str(),
                                   BM_CentroidTable, centroids, dim, used_percent)
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (const int64_t code_bytes : {32, 96}) {
    for (const CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2, CpuIsa::kPortable}) {
      benchmark::RegisterBenchmark(
          absl::StrCat("BM_ScanBlocks/", CpuIsaName(isa), "/code_bytes:", code_bytes).c_str(),
          BM_ScanBlocks, isa, code_bytes);
    }
  }
  return true;
}();

}  // namespace
}  // namespace tessera::internal

BENCHMARK_MAIN();
