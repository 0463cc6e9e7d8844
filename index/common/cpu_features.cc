#include "index/common/cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <cstdint>

namespace tessera::internal {
namespace {

bool DetectF16c() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  const bool osxsave = (ecx >> 27) & 1;
  const bool f16c = (ecx >> 29) & 1;
  if (!osxsave || !f16c) return false;
  uint32_t xcr0_low = 0, xcr0_high = 0;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  return (xcr0_low & 0x6) == 0x6;  // XMM and YMM state
#else
  return false;
#endif
}

}  // namespace

bool CpuSupportsF16c() {
  static const bool kSupported = DetectF16c();
  return kSupported;
}

}  // namespace tessera::internal
