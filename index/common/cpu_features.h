// What the CPU and the OS support, for the kernels that pick an instruction set at run time: read
// once from CPUID, with XCR0 confirming that the OS saves the vector registers a feature needs.
// The one place that asks — __builtin_cpu_supports cannot name every feature with every compiler
// the project builds with (clang < 15 does not know "f16c"), and seven call sites asking each in
// their own words had drifted (one checked FMA with AVX2, its neighbour did not).
#ifndef TESSERA_INDEX_COMMON_CPU_FEATURES_H_
#define TESSERA_INDEX_COMMON_CPU_FEATURES_H_

namespace tessera::internal {

struct CpuFeatures {
  bool sse41 = false;
  bool pclmul = false;
  bool avx = false;  // and the OS saves YMM, as for every feature below it
  bool f16c = false;
  bool fma = false;
  bool avx2 = false;
  bool avx512f = false;  // and the OS saves ZMM and the mask registers, as for every AVX-512 one
  bool avx512dq = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vnni = false;
  bool avx512vbmi = false;

  // The tiers the kernels are compiled for: AVX2 with FMA, and AVX-512 F/BW/VL/DQ with FMA.
  bool Avx2Fma() const { return avx2 && fma; }
  bool Avx512() const { return avx512f && avx512bw && avx512vl && avx512dq && fma; }
};

// This machine's features. Thread-safe; cheap after the first call.
const CpuFeatures& Cpu();

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_COMMON_CPU_FEATURES_H_
