#include "index/common/cpu_features.h"

#include "gtest/gtest.h"

namespace tessera::internal {
namespace {

// GCC's __builtin_cpu_supports is an independent reading of CPUID and XCR0 (libgcc's), so each
// feature must agree with it on whatever machine runs the test.
TEST(CpuFeatures, AgreeWithTheCompilersOwnCheck) {
  const CpuFeatures& cpu = Cpu();
  EXPECT_EQ(cpu.sse41, __builtin_cpu_supports("sse4.1") != 0);
  EXPECT_EQ(cpu.pclmul, __builtin_cpu_supports("pclmul") != 0);
  EXPECT_EQ(cpu.avx, __builtin_cpu_supports("avx") != 0);
  EXPECT_EQ(cpu.fma, __builtin_cpu_supports("fma") != 0);
  EXPECT_EQ(cpu.avx2, __builtin_cpu_supports("avx2") != 0);
  EXPECT_EQ(cpu.avx512f, __builtin_cpu_supports("avx512f") != 0);
  EXPECT_EQ(cpu.avx512dq, __builtin_cpu_supports("avx512dq") != 0);
  EXPECT_EQ(cpu.avx512bw, __builtin_cpu_supports("avx512bw") != 0);
  EXPECT_EQ(cpu.avx512vl, __builtin_cpu_supports("avx512vl") != 0);
  EXPECT_EQ(cpu.avx512vnni, __builtin_cpu_supports("avx512vnni") != 0);
  EXPECT_EQ(cpu.avx512vbmi, __builtin_cpu_supports("avx512vbmi") != 0);
#if !defined(__clang__) || __clang_major__ >= 15  // older clang cannot name f16c
  EXPECT_EQ(cpu.f16c, __builtin_cpu_supports("f16c") != 0);
#endif
}

TEST(CpuFeatures, TiersNeedEveryFeatureTheirKernelsUse) {
  const CpuFeatures& cpu = Cpu();
  EXPECT_EQ(cpu.Avx2Fma(), cpu.avx2 && cpu.fma);
  EXPECT_EQ(cpu.Avx512(), cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512dq && cpu.fma);
  // A feature on wider registers implies the OS saves the narrower ones.
  if (cpu.avx512f) EXPECT_TRUE(cpu.avx);
  if (cpu.avx2 || cpu.fma || cpu.f16c) EXPECT_TRUE(cpu.avx);
}

}  // namespace
}  // namespace tessera::internal
