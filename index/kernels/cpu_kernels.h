// The CPU similarity micro-kernels as their callers use them: which instruction set this CPU runs
// (CpuSupportsIsa, DetectCpuIsa in tessera/maxsim.h), that ISA's kernel table, and the transposed,
// padded query every kernel reads. Both stages build on these: stage 1's exact scans and centroid
// scoring (QuerySimilarity, query_similarity.h), stage 2's MaxSim
// (index/rerank/cpu_maxsim_scorer.h), and the compact MaxSim's ISA choice
// (index/centroid/code_maxsim.h).
#ifndef TESSERA_INDEX_KERNELS_CPU_KERNELS_H_
#define TESSERA_INDEX_KERNELS_CPU_KERNELS_H_

#include <cstdint>
#include <memory>

#include "index/kernels/cpu_maxsim_kernels.h"
#include "tessera/matrix.h"
#include "tessera/maxsim.h"

namespace tessera::internal {

// Memory aligned to kMaxSimAlignment (the kernels' aligned loads need it).
struct AlignedFree {
  void operator()(void* p) const;
};
using AlignedBuffer = std::unique_ptr<void, AlignedFree>;
// At least `bytes` (and at least kMaxSimAlignment) bytes, uninitialised.
AlignedBuffer AllocateAligned(int64_t bytes);

// Whether this CPU (and OS) can run kernels of `isa`; kAuto and kPortable are always supported.
bool CpuSupportsIsa(CpuIsa isa);
// "avx512", "avx2", "portable" or "auto".
const char* CpuIsaName(CpuIsa isa);

// The kernels of a concrete ISA the CPU supports (kPortable's for kAuto).
const MaxSimKernels& KernelsFor(CpuIsa isa);

// The query (nq × dim fp32) as the kernels read it: query_t[k * lanes + i] = query[i][k], padding
// lanes nq ≤ i < lanes zero, so that a tile of query rows at one dimension is one aligned vector
// load. lanes: ≥ nq, a multiple of the kernel's lane count. dim × lanes floats.
AlignedBuffer TransposeQuery(FloatMatrixView query, int64_t lanes);

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_KERNELS_CPU_KERNELS_H_
