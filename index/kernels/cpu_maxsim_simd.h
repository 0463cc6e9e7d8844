// The SIMD MaxSim kernels, written once over an ISA traits struct. Each per-ISA translation unit
// (cpu_maxsim_avx2.cc, cpu_maxsim_avx512.cc) defines its traits, includes this header and exports
// MaxSim/SimilarityBlock instantiated with them as its MaxSimKernels; the files stay separate
// because each is compiled with its own -m flags and only called after a run-time CPU check
// (cpu_maxsim_kernels.h).
//
// Vector lanes run over query tokens (the query is transposed once per call), so documents need no
// transposition, only fp16 → fp32 conversion, and the max over document tokens is an element-wise
// max with no horizontal reduction until the final (scalar) sum. Per document, a panel of up to
// Isa::kNj document tokens is read in place (fp32) or converted once into an L1-resident fp32 panel
// (fp16), and reused by every query tile. The micro-kernel multiplies kMaxQv vectors of the
// transposed query by the panel's tokens: kMaxQv × kNj accumulators; per dimension k, kMaxQv
// aligned loads, kNj broadcasts and kMaxQv × kNj FMAs. The tile's similarities then update a
// per-query-token running max (and argmax) kept in scratch. Document data is software-prefetched
// into L2 kPrefetchPanels panels ahead: without it, streaming documents from DRAM cost ~30%.
//
// Tails: the query is zero-padded to Isa::kLanes by the caller (padding lanes are ignored), short
// panels use a micro-kernel instantiated for that token count, and fp16 tails go through
// Isa::ConvertHalfTail, which reads nothing past a document's end.
//
// Include only from a per-ISA translation unit, and instantiate only with a traits struct declared
// in an unnamed namespace. Every function here is a template over the traits, so each
// instantiation then has internal linkage: no copy compiled with one ISA's flags can be merged by
// the linker into code that runs on a CPU without that ISA. For the same reason nothing here
// generates std:: or absl:: code.
//
// The traits interface (all members static; `Vec`: Isa::kLanes fp32 lanes):
//   using Vec, Index, Mask;       fp32 vector; kLanes int32 token indices; a lane mask
//   kLanes                        lanes per Vec (the caller's query padding)
//   kNj                           document tokens per micro-kernel (kMaxQv × kNj accumulators must
//                                 fit the register file with room for the loads and broadcasts)
//   Vec Zero(), Set1(float x), Broadcast(const float* p)   {0…}, {x…}, {*p…}
//   Vec Load(const float* p)                               aligned load
//   void Store(float* p, Vec), StoreUnaligned(float* p, Vec)
//   Vec Fma(Vec a, Vec b, Vec c)                           a · b + c, fused
//   Vec Max(Vec a, Vec b)                                  the max instruction, a first
//   Mask Greater(Vec a, Vec b)                             a > b, ordered, quiet
//   Vec Blend(Vec a, Vec b, Mask m)                        b where m, a elsewhere
//   Index LoadIndex(const int32_t* p), SetIndex(int32_t t) aligned load; {t…}
//   void StoreIndex(int32_t* p, Index)                     aligned store
//   Index BlendIndex(Index a, Index b, Mask m)             b where m, a elsewhere
//   Vec LoadHalf(const uint16_t* p)                        kLanes fp16 values (unaligned) → fp32
//   void ConvertHalfTail(const uint16_t* src, int64_t count, float* dst)
//                                                          0 < count < kLanes values, reading and
//                                                          writing nothing past them
#ifndef TESSERA_INDEX_KERNELS_CPU_MAXSIM_SIMD_H_
#define TESSERA_INDEX_KERNELS_CPU_MAXSIM_SIMD_H_

#include <immintrin.h>

#include <cstdint>
#include <utility>  // std::integer_sequence: types only, no code

#include "index/kernels/cpu_maxsim_kernels.h"

namespace tessera {
namespace internal {
namespace simd {

// Query vectors per micro-kernel (a tile of kMaxQv × Isa::kLanes query tokens).
constexpr int kMaxQv = 2;
// How far ahead (in panels) MaxSim prefetches document data.
constexpr int kPrefetchPanels = 2;
// How far ahead (in panels) SimilarityBlock prefetches its contiguous vectors.
constexpr int kSimilarityPrefetchPanels = 8;

// fp16 → fp32 of `count` values; nothing past src + count is read or past dst + count written.
template <class Isa>
void ConvertHalf(const uint16_t* src, int64_t count, float* dst) {
  int64_t i = 0;
  for (; i + Isa::kLanes <= count; i += Isa::kLanes) {
    Isa::StoreUnaligned(dst + i, Isa::LoadHalf(src + i));
  }
  if (i < count) Isa::ConvertHalfTail(src + i, count - i, dst + i);
}

// Asks for document data in L2 ahead of use: documents stream from DRAM in short bursts (one
// panel at a time) that the hardware prefetcher does not run ahead of. Walks documents
// [begin, end) panel by panel; each Next() requests one panel, so calling it once per panel
// computed (after kPrefetchPanels initial calls) keeps it that many panels ahead.
template <class Isa>
class PanelPrefetcher {
 public:
  PanelPrefetcher(const MaxSimKernelArgs& args, int64_t begin, int64_t end)
      : docs_(args.docs),
        end_(end),
        row_bytes_(args.dim * (args.dtype == VectorDtype::kFloat16 ? 2 : 4)),
        doc_(begin) {}

  void Next() {
    if (doc_ >= end_) return;
    const DocumentRef& doc = docs_[doc_];
    const int64_t count = doc.num_tokens - token_ < Isa::kNj ? doc.num_tokens - token_ : Isa::kNj;
    const char* p = static_cast<const char*>(doc.data) + token_ * row_bytes_;
    for (int64_t off = 0; off < count * row_bytes_; off += 64) _mm_prefetch(p + off, _MM_HINT_T1);
    token_ += Isa::kNj;
    if (token_ >= doc.num_tokens) {
      ++doc_;
      token_ = 0;
    }
  }

 private:
  const DocumentRef* const docs_;
  const int64_t end_;
  const int64_t row_bytes_;
  int64_t doc_;
  int64_t token_ = 0;
};

// What a micro-kernel does with its tile of similarities.
enum class Epilogue {
  kMax,       // fold into run_max
  kMaxIndex,  // fold into run_max and run_idx
  kStore,     // store: out[j * lanes + lane] (out is passed as run_max; run_idx is unused)
};

// Similarities of QV × Isa::kLanes query lanes (query_t already offset to the tile) against NJ
// document tokens rows[j * dim + k], folded into run_max/run_idx (first index wins exact ties
// because tokens are visited in increasing order and only a strictly greater value replaces the
// max), or stored (kStore).
template <class Isa, int QV, int NJ, Epilogue kEpilogue>
void MicroKernel(const float* __restrict query_t, int64_t lanes, int64_t dim,
                 const float* __restrict rows, float* __restrict run_max,
                 int32_t* __restrict run_idx, int32_t first_token) {
  using Vec = typename Isa::Vec;
  constexpr int kLanes = Isa::kLanes;
  // The accumulators must live in registers: unroll the j and v loops whatever the -O level.
  Vec acc[NJ][QV];
#pragma GCC unroll 16
  for (int j = 0; j < NJ; ++j) {
#pragma GCC unroll 4
    for (int v = 0; v < QV; ++v) acc[j][v] = Isa::Zero();
  }
  const float* q = query_t;
  for (int64_t k = 0; k < dim; ++k, q += lanes) {
    Vec qv[QV];
#pragma GCC unroll 4
    for (int v = 0; v < QV; ++v) qv[v] = Isa::Load(q + v * kLanes);
#pragma GCC unroll 16
    for (int j = 0; j < NJ; ++j) {
      const Vec d = Isa::Broadcast(rows + j * dim + k);
#pragma GCC unroll 4
      for (int v = 0; v < QV; ++v) acc[j][v] = Isa::Fma(qv[v], d, acc[j][v]);
    }
  }
  if (kEpilogue == Epilogue::kStore) {
#pragma GCC unroll 16
    for (int j = 0; j < NJ; ++j) {
#pragma GCC unroll 4
      for (int v = 0; v < QV; ++v) Isa::StoreUnaligned(run_max + j * lanes + v * kLanes, acc[j][v]);
    }
    return;
  }
#pragma GCC unroll 4
  for (int v = 0; v < QV; ++v) {
    Vec best = Isa::Load(run_max + v * kLanes);
    if (kEpilogue == Epilogue::kMaxIndex) {
      typename Isa::Index idx = Isa::LoadIndex(run_idx + v * kLanes);
#pragma GCC unroll 16
      for (int j = 0; j < NJ; ++j) {
        const typename Isa::Mask gt = Isa::Greater(acc[j][v], best);
        best = Isa::Blend(best, acc[j][v], gt);
        idx = Isa::BlendIndex(idx, Isa::SetIndex(first_token + j), gt);
      }
      Isa::StoreIndex(run_idx + v * kLanes, idx);
    } else {
#pragma GCC unroll 16
      for (int j = 0; j < NJ; ++j) best = Isa::Max(best, acc[j][v]);
    }
    Isa::Store(run_max + v * kLanes, best);
  }
}

using MicroKernelFn = void (*)(const float*, int64_t, int64_t, const float*, float*, int32_t*,
                               int32_t);

// Every micro-kernel of one epilogue: fns[qv - 1][nj - 1].
template <class Isa, Epilogue kEpilogue>
struct KernelTable {
  MicroKernelFn fns[kMaxQv][Isa::kNj];
};

template <class Isa, int QV, Epilogue kEpilogue, int... J>
constexpr void FillRow(MicroKernelFn* row, std::integer_sequence<int, J...>) {
  ((row[J] = &MicroKernel<Isa, QV, J + 1, kEpilogue>), ...);
}

template <class Isa, Epilogue kEpilogue>
constexpr KernelTable<Isa, kEpilogue> MakeTable() {
  static_assert(kMaxQv == 2, "MakeTable fills one row per query-vector count");
  KernelTable<Isa, kEpilogue> table{};
  FillRow<Isa, 1, kEpilogue>(table.fns[0], std::make_integer_sequence<int, Isa::kNj>());
  FillRow<Isa, 2, kEpilogue>(table.fns[1], std::make_integer_sequence<int, Isa::kNj>());
  return table;
}

template <class Isa, Epilogue kEpilogue>
constexpr KernelTable<Isa, kEpilogue> kKernels = MakeTable<Isa, kEpilogue>();

// MaxSimKernels::maxsim (cpu_maxsim_kernels.h) for one ISA.
template <class Isa>
void MaxSim(const MaxSimKernelArgs& args, int64_t begin, int64_t end, void* scratch) {
  static_assert(Isa::kNj <= kMaxSimPanelTokens, "panel does not fit the scratch");
  constexpr int kLanes = Isa::kLanes;
  constexpr int kNj = Isa::kNj;
  const int64_t lanes = args.lanes;
  const int64_t dim = args.dim;
  // Scratch layout as in MaxSimScratchBytes: run_max, run_idx, a region the SIMD kernels leave
  // unused, then the fp16 panel.
  const int64_t lane_bytes =
      (lanes * 4 + (kMaxSimAlignment - 1)) / kMaxSimAlignment * kMaxSimAlignment;
  unsigned char* bytes = static_cast<unsigned char*>(scratch);
  float* run_max = reinterpret_cast<float*>(bytes);
  bytes += lane_bytes;
  int32_t* run_idx = reinterpret_cast<int32_t*>(bytes);
  bytes += 2 * lane_bytes;
  float* panel = reinterpret_cast<float*>(bytes);

  const bool want_best = args.best_tokens != nullptr;
  const MicroKernelFn(*fns)[kNj] =
      want_best ? kKernels<Isa, Epilogue::kMaxIndex>.fns : kKernels<Isa, Epilogue::kMax>.fns;
  const typename Isa::Vec neg_inf = Isa::Set1(-__builtin_inff());
  PanelPrefetcher<Isa> prefetcher(args, begin, end);
  for (int p = 0; p < kPrefetchPanels; ++p) prefetcher.Next();

  for (int64_t d = begin; d < end; ++d) {
    const DocumentRef& doc = args.docs[d];
    const int64_t n = doc.num_tokens;
    for (int64_t i = 0; i < lanes; i += kLanes) {
      Isa::Store(run_max + i, neg_inf);
      Isa::StoreIndex(run_idx + i, Isa::SetIndex(0));
    }
    for (int64_t j0 = 0; j0 < n; j0 += kNj) {
      const int nj = static_cast<int>(n - j0 < kNj ? n - j0 : kNj);
      prefetcher.Next();
      const float* rows;
      if (args.dtype == VectorDtype::kFloat16) {
        ConvertHalf<Isa>(static_cast<const uint16_t*>(doc.data) + j0 * dim, nj * dim, panel);
        rows = panel;
      } else {
        rows = static_cast<const float*>(doc.data) + j0 * dim;
      }
      for (int64_t i0 = 0; i0 < lanes; i0 += kMaxQv * kLanes) {
        const int qv = (lanes - i0) >= kMaxQv * kLanes ? kMaxQv : 1;
        fns[qv - 1][nj - 1](args.query_t + i0, lanes, dim, rows, run_max + i0, run_idx + i0,
                            static_cast<int32_t>(j0));
      }
    }
    float score = 0.0f;
    for (int64_t i = 0; i < args.nq; ++i) score += run_max[i];
    args.scores[d] = score;
    if (want_best) {
      int32_t* out = args.best_tokens + d * args.nq;
      for (int64_t i = 0; i < args.nq; ++i) out[i] = run_idx[i];
    }
  }
}

// MaxSimKernels::similarity (cpu_maxsim_kernels.h) for one ISA.
template <class Isa>
void SimilarityBlock(const float* query_t, int64_t lanes, int64_t dim, const float* vectors,
                     int64_t n, float* out) {
  constexpr int kLanes = Isa::kLanes;
  constexpr int kNj = Isa::kNj;
  // The panel's rows are read a column at a time (kNj streams), which the hardware prefetcher
  // does not run ahead of: ask for the panel kSimilarityPrefetchPanels ahead (measured on 155k ×
  // 384 vectors with AVX-512: 51 → 60 GFLOP/s, against 75-85 on a block in cache).
  for (int64_t j0 = 0; j0 < n; j0 += kNj) {
    const int nj = static_cast<int>(n - j0 < kNj ? n - j0 : kNj);
    const float* rows = vectors + j0 * dim;
    const int64_t ahead = (j0 + kSimilarityPrefetchPanels * kNj) * dim;
    const int64_t ahead_end = (j0 + (kSimilarityPrefetchPanels + 1) * kNj) * dim;
    for (int64_t i = ahead; i < ahead_end && i < n * dim; i += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(vectors + i), _MM_HINT_T1);
    }
    for (int64_t i0 = 0; i0 < lanes; i0 += kMaxQv * kLanes) {
      const int qv = (lanes - i0) >= kMaxQv * kLanes ? kMaxQv : 1;
      kKernels<Isa, Epilogue::kStore>.fns[qv - 1][nj - 1](query_t + i0, lanes, dim, rows,
                                                          out + j0 * lanes + i0, nullptr, 0);
    }
  }
}

}  // namespace simd
}  // namespace internal
}  // namespace tessera

#endif  // TESSERA_INDEX_KERNELS_CPU_MAXSIM_SIMD_H_
