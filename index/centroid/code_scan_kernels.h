// Internal entry points of the blocked code scan (code_scan.h), one per instruction set. The AVX2
// and AVX-512 ones live in their own translation units compiled with their flags and are only
// called after a run-time CPU check; like cpu_maxsim_kernels.h this header is plain declarations,
// so that no inline function of a shared header is compiled with AVX2 flags (the linker could pick
// that copy).
#ifndef TESSERA_INDEX_CENTROID_CODE_SCAN_KERNELS_H_
#define TESSERA_INDEX_CENTROID_CODE_SCAN_KERNELS_H_

#include <cstdint>

namespace tessera::internal {

// Entries per block of a scanned list.
constexpr int64_t kScanBlockEntries = 32;

// For each of `num_blocks` consecutive blocks of code_bytes × 32 bytes (byte j of entry i at
// block[j · 32 + i]): sums[b · 32 + i] = Σ_j tables[(2j) · 16 + lo(byte)] +
// tables[(2j + 1) · 16 + hi(byte)], where lo/hi are the byte's low and high nibbles. tables:
// 2 · code_bytes × 16 bytes. The sums must fit in 16 bits (the tables' levels are chosen so).
void ScanBlocksAvx2(const uint8_t* blocks, int64_t num_blocks, int64_t code_bytes,
                    const uint8_t* tables, uint16_t* sums);
// The same with AVX-512 F + BW, two blocks per step: the same sums.
void ScanBlocksAvx512(const uint8_t* blocks, int64_t num_blocks, int64_t code_bytes,
                      const uint8_t* tables, uint16_t* sums);
void ScanBlocksPortable(const uint8_t* blocks, int64_t num_blocks, int64_t code_bytes,
                        const uint8_t* tables, uint16_t* sums);

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_CENTROID_CODE_SCAN_KERNELS_H_
