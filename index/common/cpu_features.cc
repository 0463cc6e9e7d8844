#include "index/common/cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <cstdint>

namespace tessera::internal {
namespace {

CpuFeatures Detect() {
  CpuFeatures cpu;
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return cpu;
  const unsigned leaf1_ecx = ecx;
  unsigned leaf7_ebx = 0, leaf7_ecx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    leaf7_ebx = ebx;
    leaf7_ecx = ecx;
  }
  uint64_t xcr0 = 0;
  if ((leaf1_ecx >> 27) & 1) {  // OSXSAVE: XCR0 says which register states the OS saves
    uint32_t low = 0, high = 0;
    __asm__("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
    xcr0 = (static_cast<uint64_t>(high) << 32) | low;
  }
  const bool ymm = (xcr0 & 0x6) == 0x6;    // XMM, YMM
  const bool zmm = (xcr0 & 0xe6) == 0xe6;  // and opmask, ZMM0-15 upper halves, ZMM16-31
  const auto bit = [](unsigned reg, int b) { return ((reg >> b) & 1) != 0; };
  cpu.sse41 = bit(leaf1_ecx, 19);
  cpu.pclmul = bit(leaf1_ecx, 1);
  cpu.avx = ymm && bit(leaf1_ecx, 28);
  cpu.f16c = cpu.avx && bit(leaf1_ecx, 29);
  cpu.fma = cpu.avx && bit(leaf1_ecx, 12);
  cpu.avx2 = cpu.avx && bit(leaf7_ebx, 5);
  cpu.avx512f = ymm && zmm && bit(leaf7_ebx, 16);
  cpu.avx512dq = cpu.avx512f && bit(leaf7_ebx, 17);
  cpu.avx512bw = cpu.avx512f && bit(leaf7_ebx, 30);
  cpu.avx512vl = cpu.avx512f && bit(leaf7_ebx, 31);
  cpu.avx512vbmi = cpu.avx512f && bit(leaf7_ecx, 1);
  cpu.avx512vnni = cpu.avx512f && bit(leaf7_ecx, 11);
#endif
  return cpu;
}

}  // namespace

const CpuFeatures& Cpu() {
  static const CpuFeatures kFeatures = Detect();
  return kFeatures;
}

}  // namespace tessera::internal
