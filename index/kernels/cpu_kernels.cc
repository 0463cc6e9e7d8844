// Run-time ISA selection and query preparation for the CPU micro-kernels (cpu_maxsim_*.cc).
#include "index/kernels/cpu_kernels.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "index/common/cpu_features.h"

namespace tessera {
namespace internal {

void AlignedFree::operator()(void* p) const {
  ::operator delete(p, std::align_val_t(kMaxSimAlignment));
}

AlignedBuffer AllocateAligned(int64_t bytes) {
  return AlignedBuffer(
      ::operator new(static_cast<size_t>(std::max<int64_t>(bytes, kMaxSimAlignment)),
                     std::align_val_t(kMaxSimAlignment)));
}

bool CpuSupportsIsa(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return Cpu().Avx512() && Cpu().f16c;
    case CpuIsa::kAvx2:
      return Cpu().Avx2Fma() && Cpu().f16c;
    case CpuIsa::kAuto:
    case CpuIsa::kPortable:
      return true;
  }
  return false;
}

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
      return "auto";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kPortable:
      return "portable";
  }
  return "unknown";
}

const MaxSimKernels& KernelsFor(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return kAvx512Kernels;
    case CpuIsa::kAvx2:
      return kAvx2Kernels;
    default:
      return kPortableKernels;
  }
}

AlignedBuffer TransposeQuery(FloatMatrixView query, int64_t lanes) {
  const int64_t nq = query.rows;
  const int64_t dim = query.cols;
  AlignedBuffer buffer = AllocateAligned(dim * lanes * int64_t{sizeof(float)});
  float* query_t = static_cast<float*>(buffer.get());
  std::memset(query_t, 0, static_cast<size_t>(dim * lanes) * sizeof(float));
  for (int64_t i = 0; i < nq; ++i) {
    const float* row = query.data + i * dim;
    for (int64_t k = 0; k < dim; ++k) query_t[k * lanes + i] = row[k];
  }
  return buffer;
}

}  // namespace internal

CpuIsa DetectCpuIsa() {
  static const CpuIsa kBest = [] {
    if (internal::CpuSupportsIsa(CpuIsa::kAvx512)) return CpuIsa::kAvx512;
    if (internal::CpuSupportsIsa(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
    return CpuIsa::kPortable;
  }();
  return kBest;
}

}  // namespace tessera
