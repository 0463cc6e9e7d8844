// Scoring residual codes without decoding them, 32 entries at a time: the layout and 8-bit lookup
// tables of FAISS's "fast scan" product quantisers, applied to ResidualCodec's nibbles.
//
// An inverted list keeps its codes in blocks of kScanBlockEntries entries, byte-transposed: byte j
// of entry i sits at block[j · 32 + i], so that one 32-byte load brings byte j of all 32 entries.
// Every code byte holds two nibbles (for nbits 2: two dimensions each; for 4: one). A query row's
// score of a code is a sum of one table value per nibble (ResidualCodec::BuildLookupTable);
// quantised to small integers, 32 such lookups are one vpshufb, and a block's 32 sums take
// 2 · code_bytes shuffles instead of 32 · code_bytes scalar loads.
//
// Quantisation: every table is shifted by its minimum (their sum is `bias`) and all share one step,
// so that score ≈ bias + step · sum, each table value rounded to the nearest level — an error of
// at most step / 2 per nibble. The level count is the largest that keeps any sum within 16 bits
// (255 up to 257 nibbles, i.e. dim 514 at 2 bits and 257 at 4 bits).
#ifndef TESSERA_INDEX_CENTROID_CODE_SCAN_H_
#define TESSERA_INDEX_CENTROID_CODE_SCAN_H_

#include <cstdint>
#include <vector>

#include "index/centroid/code_scan_kernels.h"

namespace tessera::internal {

// Bytes of one block of codes of code_bytes bytes each.
inline int64_t ScanBlockBytes(int64_t code_bytes) { return code_bytes * kScanBlockEntries; }

// Writes / reads entry `entry` (counted from the first block) of blocked codes.
void PutBlockedCode(const uint8_t* code, int64_t code_bytes, int64_t entry, uint8_t* blocks);
void GetBlockedCode(const uint8_t* blocks, int64_t code_bytes, int64_t entry, uint8_t* code);

// One query row's quantised tables.
struct ScanTables {
  std::vector<uint8_t> levels;  // nibbles × 16
  float bias = 0.0f;
  float step = 0.0f;
};

// lut: nibbles × 16 float table values (ResidualCodec::BuildLookupTable) → their quantised form.
void QuantizeScanTables(const float* lut, int64_t nibbles, ScanTables* out);

// The 16-bit sums of `num_blocks` blocks (see ScanBlocksAvx2): sums[b · 32 + i] for entry i of
// block b, each ≈ (score − bias) / step. Uses AVX-512 (F, BW) or AVX2 when the CPU has it. Scans
// kScanPrefetchBytes of blocks at a time, the next ones prefetched meanwhile.
void ScanBlocks(const uint8_t* blocks, int64_t num_blocks, int64_t code_bytes,
                const ScanTables& tables, uint16_t* sums);

// How far ScanBlocks reads ahead of its scan (a search also prefetches half of it, the first bytes
// of the next list a token will scan, with PrefetchScan): a list's codes come from memory, not
// cache (at 1M documents a query scans ~27 MB of them, a token ~40 lists of ~31 KB), and the
// hardware prefetcher restarts at every list. Measured on the 1M-document shard (AMD EPYC Zen 4,
// alternated with the binary without it): stage 1 at P50 0.86–0.96×, 8% faster at the median
// (docs/results.md, "Stage 1 at 1M against the machine"); at 100k documents the same as without.
inline constexpr int64_t kScanPrefetchBytes = 4096;
// Prefetches [data, data + bytes) into the cache, a line at a time.
void PrefetchScan(const uint8_t* data, int64_t bytes);

}  // namespace tessera::internal

#endif  // TESSERA_INDEX_CENTROID_CODE_SCAN_H_
