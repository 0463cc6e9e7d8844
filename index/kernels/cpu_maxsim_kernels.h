// Internal entry points of the CPU MaxSim kernels: one MaxSimKernels table per instruction set.
// Each lives in its own translation unit compiled with that ISA's flags (see CMakeLists.txt) and
// is only called after a run-time CPU check. Those files must not odr-use inline functions or
// templates from shared headers (std::, absl::): a COMDAT copy compiled with AVX-512 could be
// picked by the linker for the whole program. That is why this header is plain data and
// declarations only, and why cpu_maxsim_simd.h instantiates everything with internal linkage.
#ifndef TESSERA_INDEX_KERNELS_CPU_MAXSIM_KERNELS_H_
#define TESSERA_INDEX_KERNELS_CPU_MAXSIM_KERNELS_H_

#include <cstdint>

#include "tessera/maxsim.h"

namespace tessera {
namespace internal {

// Alignment of the transposed query and of every scratch region, in bytes.
constexpr int64_t kMaxSimAlignment = 64;

// One Score() call, prepared for a kernel.
struct MaxSimKernelArgs {
  // The query transposed and zero-padded: query_t[k * lanes + i] = query[i][k] for i < nq, 0 for
  // nq ≤ i < lanes. `dim × lanes`, kMaxSimAlignment-aligned; lanes is a multiple of the kernel's
  // lane count.
  const float* query_t = nullptr;
  int64_t lanes = 0;
  int64_t nq = 0;
  int64_t dim = 0;
  VectorDtype dtype = VectorDtype::kFloat32;
  // docs[d].data: num_tokens × dim values of `dtype`, num_tokens ≥ 1 (validated).
  const DocumentRef* docs = nullptr;
  // Outputs: scores[d], and best_tokens[d * nq + i] when best_tokens is non-null.
  float* scores = nullptr;
  int32_t* best_tokens = nullptr;
};

// Bytes of scratch one kernel call needs (the same bound for every kernel).
int64_t MaxSimScratchBytes(int64_t lanes, int64_t dim);

// One instruction set's kernels. Plain data, constant-initialised: safe to use from static
// initialisers of other translation units.
struct MaxSimKernels {
  // Score documents [begin, end) of `args`. `scratch`: MaxSimScratchBytes(args.lanes, args.dim)
  // bytes, kMaxSimAlignment-aligned, private to this call. Safe to call concurrently on disjoint
  // document ranges with distinct scratch.
  void (*maxsim)(const MaxSimKernelArgs& args, int64_t begin, int64_t end, void* scratch);
  // Inner products of `n` fp32 vectors (vectors[j * dim + k]) with every lane of `query_t` (laid
  // out as MaxSimKernelArgs::query_t): out[j * lanes + i] for j < n, i < lanes (0 in padding
  // lanes). Stage 1's exact candidate scans use these: the MaxSim micro-kernels with a store for an
  // epilogue.
  void (*similarity)(const float* query_t, int64_t lanes, int64_t dim, const float* vectors,
                     int64_t n, float* out);
  // Query lanes the kernels expect the transposed query padded to (a multiple of; their vector
  // width).
  int64_t lanes;
};

// Defined in cpu_maxsim_avx512.cc, cpu_maxsim_avx2.cc and cpu_maxsim_portable.cc.
extern const MaxSimKernels kAvx512Kernels;
extern const MaxSimKernels kAvx2Kernels;
extern const MaxSimKernels kPortableKernels;

// Number of document tokens the SIMD kernels convert/process per panel (scratch is sized for it).
constexpr int64_t kMaxSimPanelTokens = 16;

}  // namespace internal
}  // namespace tessera

#endif  // TESSERA_INDEX_KERNELS_CPU_MAXSIM_KERNELS_H_
