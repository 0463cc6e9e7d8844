// CPU features that the kernels select on at run time and that __builtin_cpu_supports cannot name
// with every compiler the project builds with (clang < 15 does not know "f16c"): read from CPUID,
// with the OS's XCR0 confirming it saves the vector registers the feature needs.
#ifndef TESSERA_INDEX_COMMON_CPU_FEATURES_H_
#define TESSERA_INDEX_COMMON_CPU_FEATURES_H_

namespace tessera::internal {

// F16C (fp16 ↔ fp32 conversion on 128/256-bit registers) usable: the CPU has it and the OS saves
// the YMM registers. Thread-safe; cheap after the first call.
bool CpuSupportsF16c();

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_COMMON_CPU_FEATURES_H_
