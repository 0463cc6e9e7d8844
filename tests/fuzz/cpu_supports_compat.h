// Forced into every file of the fuzz build (-include) when the compiler is clang older than 15,
// whose __builtin_cpu_supports does not know "f16c" (index/common/float16.cc and
// index/kernels/cpu_kernels.cc ask for it; GCC and clang ≥ 15 do know it). The builtin is
// replaced by a CPUID/XGETBV check of the features the code base asks for, so that the fuzzers run
// the same per-ISA kernels as the release build. Unknown names are reported as unsupported.
#ifndef TESSERA_TESTS_FUZZ_CPU_SUPPORTS_COMPAT_H_
#define TESSERA_TESTS_FUZZ_CPU_SUPPORTS_COMPAT_H_

#if defined(__clang__) && __clang_major__ < 15 && defined(__x86_64__)

#include <cpuid.h>

static inline int TesseraFuzzCpuSupports(const char* feature) {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return 0;
  const unsigned leaf1_ecx = ecx;
  unsigned leaf7_ebx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) leaf7_ebx = ebx;
  unsigned long long xcr0 = 0;
  if ((leaf1_ecx >> 27) & 1) {  // OSXSAVE: the OS saves the vector registers it enables in XCR0
    unsigned lo = 0, hi = 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<unsigned long long>(hi) << 32) | lo;
  }
  const bool ymm = (xcr0 & 0x6) == 0x6;
  const bool zmm = (xcr0 & 0xe6) == 0xe6;
  const auto is = [feature](const char* name) { return __builtin_strcmp(feature, name) == 0; };
  if (is("avx")) return ymm && ((leaf1_ecx >> 28) & 1);
  if (is("f16c")) return ymm && ((leaf1_ecx >> 29) & 1);
  if (is("fma")) return ymm && ((leaf1_ecx >> 12) & 1);
  if (is("avx2")) return ymm && ((leaf7_ebx >> 5) & 1);
  if (is("avx512f")) return zmm && ((leaf7_ebx >> 16) & 1);
  if (is("avx512dq")) return zmm && ((leaf7_ebx >> 17) & 1);
  if (is("avx512bw")) return zmm && ((leaf7_ebx >> 30) & 1);
  if (is("avx512vl")) return zmm && ((leaf7_ebx >> 31) & 1);
  return 0;
}

#define __builtin_cpu_supports(feature) TesseraFuzzCpuSupports(feature)

#endif

#endif  // TESSERA_TESTS_FUZZ_CPU_SUPPORTS_COMPAT_H_
