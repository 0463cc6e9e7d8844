// Fused MaxSim kernels (see maxsim_kernel.cuh): dot → running max → sum in registers, one warp per
// document, blocks persistent over the batch so that each block loads the query into shared memory
// once.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "index/rerank/cuda/maxsim_kernel.cuh"

namespace tessera {
namespace internal {
namespace {

constexpr int kThreads = kMaxSimWarpsPerBlock * 32;
constexpr unsigned kFullMask = 0xffffffffu;
// 16-byte fragments per tensor-core query tile and 32-dim pair: 2 m16 tiles × 2 row halves × 2
// precisions (hi, lo) × 32 lanes.
constexpr int kFragmentsPerPair = 2 * 2 * 2 * 32;
// Resident blocks per SM the tensor-core kernel is compiled for: 3 × 4 warps leaves it 168
// registers per thread (accumulators 32, two pairs of document fragments 32, query fragments 16),
// enough not to spill; the L2 prefetch of the next 32 tokens supplies the memory parallelism.
constexpr int kTensorCoreMinBlocks = 3;

// Keeps (value, index) of the larger value; on an exact tie the lower index, so that reductions in
// any order agree with a sequential scan.
__device__ __forceinline__ void KeepMax(float& value, int& index, float other_value,
                                        int other_index) {
  if (other_value > value || (other_value == value && other_index < index)) {
    value = other_value;
    index = other_index;
  }
}

__device__ __forceinline__ void WarpArgMax(float& value, int& index, int first_offset) {
  for (int offset = first_offset; offset > 0; offset >>= 1) {
    const float other_value = __shfl_xor_sync(kFullMask, value, offset);
    const int other_index = __shfl_xor_sync(kFullMask, index, offset);
    KeepMax(value, index, other_value, other_index);
  }
}

__device__ __forceinline__ float WarpSum(float value) {
  for (int offset = 16; offset > 0; offset >>= 1)
    value += __shfl_xor_sync(kFullMask, value, offset);
  return value;
}

// Asks L2 for [begin, begin + bytes), one 128-byte line per lane per round. A hint: the loads that
// follow stay correct whether or not it lands.
__device__ __forceinline__ void PrefetchL2(const void* begin, int64_t bytes, int lane) {
  const char* p = static_cast<const char*>(begin);
  for (int64_t offset = int64_t{lane} * 128; offset < bytes; offset += 32 * 128) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p + offset));
  }
}

// D (16×8, fp32) += A (16×16, fp16, row) · B (16×8, fp16, col). Fragment ownership (PTX ISA,
// "Matrix Fragments for mma.m16n8k16"), g = lane / 4, t = lane % 4:
//   a0: A[g][2t..2t+1]   a1: A[g+8][2t..2t+1]   a2: A[g][2t+8..2t+9]   a3: A[g+8][2t+8..2t+9]
//   b0: B[2t..2t+1][g]   b1: B[2t+8..2t+9][g]
//   d0, d1: D[g][2t], D[g][2t+1]                 d2, d3: D[g+8][2t], D[g+8][2t+1]
__device__ __forceinline__ void Mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  __trap();  // the host never selects this kernel below compute capability 8.0
#endif
}

// Tensor-core kernel. M = query tokens (two m16 tiles per 32-token query tile), N = document tokens
// (four n8 tiles per 32-token step), K = dim.
//
// K order: the dot product does not care in which order dims are summed, only that A and B agree.
// Each lane loads 16 contiguous bytes (8 dims) per row: dims [32p + 8t, 32p + 8t + 8) of pair p.
// Their four 32-bit words x, y, z, w (dims +0..1, +2..3, +4..5, +6..7) are MMA k-slots
// (2t..2t+1, 2t+8..2t+9) of k-step 2p (x, y) and of k-step 2p+1 (z, w), for the query rows
// (A: a0/a2 from row g, a1/a3 from row g+8) and for the document token (B: b0, b1) alike. So every
// document row is read with coalesced 16-byte loads straight into MMA registers, and the query
// (stored in exactly this order, see PrepareMaxSimQuery) with conflict-free linear 16-byte loads.
//
// Each lane keeps, per query row it owns (rows g and g+8 of each m16 tile), the running max over
// the document tokens of its accumulator columns (2t, 2t+1 of each n8 tile); lanes t = 0..3 are
// merged with two shuffles per document, then the warp sums over query rows.
template <bool kBest>
__global__ void __launch_bounds__(kThreads, kTensorCoreMinBlocks)
    TensorCoreMaxSimKernel(DeviceDocuments docs, const uint4* __restrict__ query,
                           int64_t tile_begin, int tile_count, int64_t nq, float inv_scale,
                           bool accumulate, float* __restrict__ scores,
                           int32_t* __restrict__ best_tokens) {
  extern __shared__ uint4 smem_query[];
  const int pairs = static_cast<int>(docs.dim / 32);
  const int fragments_per_tile = pairs * kFragmentsPerPair;
  {
    const uint4* src = query + tile_begin * fragments_per_tile;
    const int count = tile_count * fragments_per_tile;
    for (int i = threadIdx.x; i < count; i += kThreads) smem_query[i] = src[i];
  }
  __syncthreads();

  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int64_t row_vectors = docs.dim / 8;  // 16-byte vectors per document token
  const uint4* vectors = static_cast<const uint4*>(docs.vectors);
  const int64_t warp_stride = int64_t{gridDim.x} * kMaxSimWarpsPerBlock;
  const uint4 zero = make_uint4(0, 0, 0, 0);

  for (int64_t doc = int64_t{blockIdx.x} * kMaxSimWarpsPerBlock + (threadIdx.x >> 5);
       doc < docs.num_docs; doc += warp_stride) {
    const int n = docs.num_tokens[doc];
    const uint4* doc_vectors = vectors + docs.token_begin[doc] * row_vectors;
    float total = 0.0f;
    for (int tile = 0; tile < tile_count; ++tile) {
      const uint4* fragments = smem_query + tile * fragments_per_tile + lane;
      float best[2][2];  // [m16 tile][row g, row g + 8]
      int best_index[2][2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          best[mt][h] = -INFINITY;
          best_index[mt][h] = 0;
        }
      }

      for (int j0 = 0; j0 < n; j0 += 32) {
        if (j0 + 32 < n) {
          PrefetchL2(doc_vectors + (j0 + 32) * row_vectors,
                     int64_t{min(32, n - j0 - 32)} * row_vectors * 16, lane);
        } else if (tile == tile_count - 1 && doc + warp_stride < docs.num_docs) {
          const int64_t next = doc + warp_stride;
          PrefetchL2(vectors + docs.token_begin[next] * row_vectors,
                     int64_t{min(32, docs.num_tokens[next])} * row_vectors * 16, lane);
        }

        // This lane's B rows: document tokens j0 + 8·nt + g, 16 bytes at dims 32p + 8t.
        const uint4* rows[4];
        bool valid[4];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int j = j0 + nt * 8 + g;
          valid[nt] = j < n;
          rows[nt] = doc_vectors + (valid[nt] ? j : 0) * row_vectors + t;
        }
        float acc[2][4][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[mt][nt][c] = 0.0f;
          }
        }
        uint4 cur[4];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) cur[nt] = valid[nt] ? __ldg(rows[nt]) : zero;

        for (int p = 0; p < pairs; ++p) {
          // Issue the next pair's loads before this pair's MMAs.
          uint4 next[4];
          const bool more = p + 1 < pairs;
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
            next[nt] = (more && valid[nt]) ? __ldg(rows[nt] + 4 * (p + 1)) : zero;
          }
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            // Fragment index ((((p·2 + mt)·2 + h)·2 + precision)·32 + lane.
            const uint4* f = fragments + (p * 2 + mt) * 128;
            const uint4 hi0 = f[0];   // row g, hi
            const uint4 lo0 = f[32];  // row g, lo
            const uint4 hi1 = f[64];  // row g + 8, hi
            const uint4 lo1 = f[96];  // row g + 8, lo
            // Consecutive MMAs go to different accumulators (n8 tiles) so that they can overlap.
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
              Mma16816(acc[mt][nt], hi0.x, hi1.x, hi0.y, hi1.y, cur[nt].x, cur[nt].y);
            }
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
              Mma16816(acc[mt][nt], lo0.x, lo1.x, lo0.y, lo1.y, cur[nt].x, cur[nt].y);
            }
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
              Mma16816(acc[mt][nt], hi0.z, hi1.z, hi0.w, hi1.w, cur[nt].z, cur[nt].w);
            }
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
              Mma16816(acc[mt][nt], lo0.z, lo1.z, lo0.w, lo1.w, cur[nt].z, cur[nt].w);
            }
          }
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) cur[nt] = next[nt];
        }

        // acc[mt][nt][2h + e] = ⟨query row 16·mt + 8·h + g, document token j0 + 8·nt + 2t + e⟩.
        // Per (mt, h) the tokens are visited in increasing order, so ">" keeps the first maximum.
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int j = j0 + nt * 8 + 2 * t + e;
                const float v = acc[mt][nt][2 * h + e];
                if (j < n && v > best[mt][h]) {
                  best[mt][h] = v;
                  best_index[mt][h] = j;
                }
              }
            }
          }
        }
      }

      // Merge the four lanes (t) that share query rows, then sum the rows this tile owns.
      float part = 0.0f;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          WarpArgMax(best[mt][h], best_index[mt][h], 2);
          const int64_t row = (tile_begin + tile) * kTensorCoreQueryTile + mt * 16 + h * 8 + g;
          if (t == 0 && row < nq) {
            part += best[mt][h];
            if (kBest) best_tokens[doc * nq + row] = best_index[mt][h];
          }
        }
      }
      total += WarpSum(part);
    }
    if (lane == 0) scores[doc] = (accumulate ? scores[doc] : 0.0f) + total * inv_scale;
  }
}

template <typename T>
__device__ __forceinline__ float ToFloat(T value);
template <>
__device__ __forceinline__ float ToFloat<float>(float value) {
  return value;
}
template <>
__device__ __forceinline__ float ToFloat<__half>(__half value) {
  return __half2float(value);
}

// Eight consecutive values from 16-byte-aligned memory.
__device__ __forceinline__ void Load8(const __half* p, float (&out)[8]) {
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void Load8(const float* p, float (&out)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
  out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}

// SIMT kernel: lane l scores document tokens l, l + 32, … against a tile of up to 16 query rows
// held in shared memory (read as broadcasts), keeping a running max per query row; a shuffle
// reduction per row merges the lanes. kVec: dim % 8 == 0, so rows are 16-byte aligned and read as
// vectors.
template <typename T, bool kVec, bool kBest>
__global__ void __launch_bounds__(kThreads)
    SimtMaxSimKernel(DeviceDocuments docs, const float* __restrict__ query, int64_t row_begin,
                     int row_count, int tile_tokens, int64_t nq, bool accumulate,
                     float* __restrict__ scores, int32_t* __restrict__ best_tokens) {
  extern __shared__ float4 smem_raw[];
  float* smem_query = reinterpret_cast<float*>(smem_raw);
  const int64_t dim = docs.dim;
  {
    const float* src = query + row_begin * dim;
    const int64_t count = int64_t{row_count} * dim;
    for (int64_t i = threadIdx.x; i < count; i += kThreads) smem_query[i] = src[i];
  }
  __syncthreads();

  const int lane = threadIdx.x & 31;
  const T* vectors = static_cast<const T*>(docs.vectors);
  const int64_t warp_stride = int64_t{gridDim.x} * kMaxSimWarpsPerBlock;

  for (int64_t doc = int64_t{blockIdx.x} * kMaxSimWarpsPerBlock + (threadIdx.x >> 5);
       doc < docs.num_docs; doc += warp_stride) {
    const int n = docs.num_tokens[doc];
    const T* doc_vectors = vectors + docs.token_begin[doc] * dim;
    float total = 0.0f;
    for (int r0 = 0; r0 < row_count; r0 += tile_tokens) {
      const int count = min(tile_tokens, row_count - r0);  // warp-uniform
      const float* q = smem_query + int64_t{r0} * dim;
      float best[kSimtQueryTile];
      int best_index[kSimtQueryTile];
#pragma unroll
      for (int i = 0; i < kSimtQueryTile; ++i) {
        best[i] = -INFINITY;
        best_index[i] = 0;
      }
      for (int j = lane; j < n; j += 32) {
        const T* row = doc_vectors + int64_t{j} * dim;
        float acc[kSimtQueryTile];
#pragma unroll
        for (int i = 0; i < kSimtQueryTile; ++i) acc[i] = 0.0f;
        int64_t k = 0;
        if (kVec) {
          for (; k + 8 <= dim; k += 8) {
            float d[8];
            Load8(row + k, d);
#pragma unroll
            for (int i = 0; i < kSimtQueryTile; ++i) {
              if (i < count) {
                const float4* qi = reinterpret_cast<const float4*>(q + i * dim + k);
                const float4 a = qi[0];
                const float4 b = qi[1];
                float s = acc[i];
                s = fmaf(a.x, d[0], s);
                s = fmaf(a.y, d[1], s);
                s = fmaf(a.z, d[2], s);
                s = fmaf(a.w, d[3], s);
                s = fmaf(b.x, d[4], s);
                s = fmaf(b.y, d[5], s);
                s = fmaf(b.z, d[6], s);
                s = fmaf(b.w, d[7], s);
                acc[i] = s;
              }
            }
          }
        }
        for (; k < dim; ++k) {
          const float d = ToFloat(row[k]);
#pragma unroll
          for (int i = 0; i < kSimtQueryTile; ++i) {
            if (i < count) acc[i] = fmaf(q[i * dim + k], d, acc[i]);
          }
        }
        // A lane's tokens increase, so ">" keeps its first maximum.
#pragma unroll
        for (int i = 0; i < kSimtQueryTile; ++i) {
          if (i < count && acc[i] > best[i]) {
            best[i] = acc[i];
            best_index[i] = j;
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kSimtQueryTile; ++i) {
        if (i < count) {
          WarpArgMax(best[i], best_index[i], 16);
          if (lane == 0) {
            total += best[i];
            if (kBest) best_tokens[doc * nq + row_begin + r0 + i] = best_index[i];
          }
        }
      }
    }
    if (lane == 0) scores[doc] = (accumulate ? scores[doc] : 0.0f) + total;
  }
}

// Launches `kernel` with as many blocks as fit on the device at once (capped by the work), so that
// each block's query load is amortised over many documents.
template <typename... KernelArgs, typename... Args>
cudaError_t LaunchPersistent(void (*kernel)(KernelArgs...), int64_t num_docs, size_t smem_bytes,
                             cudaStream_t stream, Args... args) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  int sms = 0;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  int blocks_per_sm = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, kThreads, smem_bytes);
  if (err != cudaSuccess) return err;
  const int64_t wanted = (num_docs + kMaxSimWarpsPerBlock - 1) / kMaxSimWarpsPerBlock;
  const int64_t resident = int64_t{sms} * std::max(1, blocks_per_sm);
  const unsigned grid = static_cast<unsigned>(std::min(wanted, resident));
  kernel<<<grid, kThreads, smem_bytes, stream>>>(args...);
  return cudaGetLastError();
}

template <bool kBest>
cudaError_t LaunchTensorCore(const PreparedQuery& query, const MaxSimLaunch& launch,
                             cudaStream_t stream) {
  const int64_t pairs = query.dim / 32;
  const auto* fragments = static_cast<const uint4*>(launch.query);
  for (int64_t t0 = 0; t0 < query.num_tiles; t0 += query.tiles_per_launch) {
    const int tiles = static_cast<int>(std::min(query.tiles_per_launch, query.num_tiles - t0));
    const size_t smem = static_cast<size_t>(tiles * pairs * kFragmentsPerPair) * sizeof(uint4);
    const cudaError_t err = LaunchPersistent(
        &TensorCoreMaxSimKernel<kBest>, launch.docs.num_docs, smem, stream, launch.docs, fragments,
        t0, tiles, query.nq, query.inv_scale, t0 > 0, launch.scores, launch.best_tokens);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

template <typename T, bool kVec, bool kBest>
cudaError_t LaunchSimt(const PreparedQuery& query, const MaxSimLaunch& launch,
                       cudaStream_t stream) {
  const auto* rows = static_cast<const float*>(launch.query);
  const int64_t rows_per_launch = query.tiles_per_launch * query.tile_tokens;
  for (int64_t r0 = 0; r0 < query.nq; r0 += rows_per_launch) {
    const int row_count = static_cast<int>(std::min(rows_per_launch, query.nq - r0));
    const size_t smem = static_cast<size_t>(row_count * query.dim) * sizeof(float);
    const cudaError_t err = LaunchPersistent(
        &SimtMaxSimKernel<T, kVec, kBest>, launch.docs.num_docs, smem, stream, launch.docs, rows,
        r0, row_count, query.tile_tokens, query.nq, r0 > 0, launch.scores, launch.best_tokens);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

template <typename T>
cudaError_t LaunchSimtFor(const PreparedQuery& query, const MaxSimLaunch& launch,
                          cudaStream_t stream) {
  const bool vec = query.dim % 8 == 0;
  const bool best = launch.best_tokens != nullptr;
  if (vec) {
    return best ? LaunchSimt<T, true, true>(query, launch, stream)
                : LaunchSimt<T, true, false>(query, launch, stream);
  }
  return best ? LaunchSimt<T, false, true>(query, launch, stream)
              : LaunchSimt<T, false, false>(query, launch, stream);
}

}  // namespace

bool TensorCoreKernelSupports(bool fp16, int64_t dim) {
  return fp16 && dim >= 32 && dim % 32 == 0 && dim <= kTensorCoreMaxDim;
}

bool SimtKernelSupports(int64_t dim) { return dim >= 1 && dim <= kSimtMaxDim; }

PreparedQuery PrepareMaxSimQuery(MaxSimKernelKind kind, const float* query, int64_t nq,
                                 int64_t dim) {
  PreparedQuery prepared;
  prepared.kind = kind;
  prepared.nq = nq;
  prepared.dim = dim;
  if (kind == MaxSimKernelKind::kSimt) {
    prepared.tile_tokens = static_cast<int>(std::min<int64_t>(kSimtQueryTile, kSimtMaxDim / dim));
    prepared.num_tiles = (nq + prepared.tile_tokens - 1) / prepared.tile_tokens;
    prepared.tiles_per_launch =
        std::max<int64_t>(1, kSimtMaxDim / (int64_t{prepared.tile_tokens} * dim));
    prepared.words.resize(static_cast<size_t>(nq * dim));
    std::memcpy(prepared.words.data(), query, prepared.bytes());
    return prepared;
  }

  const int64_t pairs = dim / 32;
  prepared.tile_tokens = kTensorCoreQueryTile;
  prepared.num_tiles = (nq + kTensorCoreQueryTile - 1) / kTensorCoreQueryTile;
  const int64_t tile_bytes = pairs * kFragmentsPerPair * int64_t{sizeof(uint4)};
  prepared.tiles_per_launch =
      std::max<int64_t>(1, static_cast<int64_t>(kMaxSimQuerySmemBytes) / tile_bytes);

  // Scale by 2^shift so that max |q| lands in [1, 2): the hi half then keeps 11 significant bits
  // of every value near the maximum and the lo half the next 11, far from fp16 overflow.
  float max_abs = 0.0f;
  for (int64_t i = 0; i < nq * dim; ++i) max_abs = std::max(max_abs, std::fabs(query[i]));
  int shift = 0;
  if (max_abs > 0.0f) {
    int exponent = 0;
    std::frexp(max_abs, &exponent);  // max_abs = f · 2^exponent, f in [0.5, 1)
    shift = std::clamp(1 - exponent, -126, 126);
  }
  const float scale = std::ldexp(1.0f, shift);
  prepared.inv_scale = std::ldexp(1.0f, -shift);

  prepared.words.assign(static_cast<size_t>(prepared.num_tiles * tile_bytes / 4), 0u);
  uint32_t* words = prepared.words.data();
  for (int64_t tile = 0; tile < prepared.num_tiles; ++tile) {
    for (int64_t p = 0; p < pairs; ++p) {
      for (int mt = 0; mt < 2; ++mt) {
        for (int h = 0; h < 2; ++h) {
          for (int precision = 0; precision < 2; ++precision) {
            for (int lane = 0; lane < 32; ++lane) {
              const int64_t fragment =
                  (((((tile * pairs + p) * 2 + mt) * 2 + h) * 2 + precision) * 32) + lane;
              const int64_t row = tile * kTensorCoreQueryTile + mt * 16 + h * 8 + lane / 4;
              if (row >= nq) continue;  // zero rows
              for (int e = 0; e < 8; ++e) {
                const int64_t k = 32 * p + 8 * (lane % 4) + e;
                const float v = query[row * dim + k] * scale;
                const __half hi = __float2half_rn(v);
                const __half half_value =
                    precision == 0 ? hi : __float2half_rn(v - __half2float(hi));
                uint16_t bits;
                std::memcpy(&bits, &half_value, sizeof(bits));
                words[fragment * 4 + e / 2] |= uint32_t{bits} << (16 * (e % 2));
              }
            }
          }
        }
      }
    }
  }
  return prepared;
}

cudaError_t CheckMaxSimKernelImage() {
  cudaFuncAttributes attributes;
  cudaError_t err = cudaFuncGetAttributes(&attributes, &TensorCoreMaxSimKernel<false>);
  if (err != cudaSuccess) return err;
  return cudaFuncGetAttributes(&attributes, &SimtMaxSimKernel<__half, true, false>);
}

cudaError_t LaunchMaxSim(const PreparedQuery& query, const MaxSimLaunch& launch,
                         cudaStream_t stream) {
  if (launch.docs.num_docs == 0 || query.nq == 0) return cudaSuccess;
  if (query.kind == MaxSimKernelKind::kTensorCore) {
    return launch.best_tokens != nullptr ? LaunchTensorCore<true>(query, launch, stream)
                                         : LaunchTensorCore<false>(query, launch, stream);
  }
  return launch.docs.fp16 ? LaunchSimtFor<__half>(query, launch, stream)
                          : LaunchSimtFor<float>(query, launch, stream);
}

}  // namespace internal
}  // namespace tessera
