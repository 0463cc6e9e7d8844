// RAII owners for the CUDA resources the GPU scorer holds (device memory, pinned host memory, a
// stream, events) and the one translation of cudaError_t into absl::Status. Plain C++: uses only
// the CUDA runtime API. None of these types is thread-safe; their owner serialises access.
#ifndef TESSERA_INDEX_RERANK_CUDA_DEVICE_BUFFER_H_
#define TESSERA_INDEX_RERANK_CUDA_DEVICE_BUFFER_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "tessera/status_macros.h"

namespace tessera {
namespace internal {

// OK for cudaSuccess; otherwise "<what>: <cudaErrorName> (<description>)" as
// RESOURCE_EXHAUSTED (out of device or pinned memory), FAILED_PRECONDITION (no device, no or old
// driver, no kernel image for this device) or INTERNAL (anything else, e.g. a faulting kernel).
inline absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

#define TESSERA_CUDA_RETURN_IF_ERROR(expr, what) \
  TESSERA_RETURN_IF_ERROR(::tessera::internal::CudaStatus((expr), (what)))

// How a CudaBuffer allocates and frees its memory.
struct DeviceAllocator {
  static cudaError_t Allocate(void** data, size_t bytes) { return cudaMalloc(data, bytes); }
  static void Free(void* data) { cudaFree(data); }
  static std::string Describe(size_t bytes) {
    return absl::StrCat("cudaMalloc of ", bytes, " bytes");
  }
};

struct PinnedAllocator {
  static cudaError_t Allocate(void** data, size_t bytes) {
    return cudaHostAlloc(data, bytes, cudaHostAllocDefault);
  }
  static void Free(void* data) { cudaFreeHost(data); }
  static std::string Describe(size_t bytes) {
    return absl::StrCat("cudaHostAlloc of ", bytes, " pinned bytes");
  }
};

// Memory of a fixed capacity from `Allocator`; Resize() reallocates (contents are not kept).
template <typename Allocator>
class CudaBuffer {
 public:
  CudaBuffer() = default;
  ~CudaBuffer() { Release(); }
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;

  // Frees the old memory first, so that old and new never coexist against a budget.
  absl::Status Resize(size_t bytes) {
    Release();
    if (bytes == 0) return absl::OkStatus();
    TESSERA_CUDA_RETURN_IF_ERROR(Allocator::Allocate(&data_, bytes), Allocator::Describe(bytes));
    capacity_ = bytes;
    return absl::OkStatus();
  }

  void Release() {
    if (data_ != nullptr) Allocator::Free(data_);
    data_ = nullptr;
    capacity_ = 0;
  }

  char* data() const { return static_cast<char*>(data_); }
  size_t capacity() const { return capacity_; }

 private:
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

// Device memory.
using DeviceBuffer = CudaBuffer<DeviceAllocator>;
// Page-locked host memory, so that cudaMemcpyAsync from it is a true asynchronous DMA.
using PinnedBuffer = CudaBuffer<PinnedAllocator>;

class CudaStream {
 public:
  CudaStream() = default;
  ~CudaStream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  // A stream that does not synchronise with the legacy default stream.
  absl::Status Create() {
    return CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                      "cudaStreamCreateWithFlags");
  }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class CudaEvent {
 public:
  CudaEvent() = default;
  ~CudaEvent() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  // A synchronisation-only event (no timing). Until first recorded, waiting on it returns at once.
  absl::Status Create() {
    return CudaStatus(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming),
                      "cudaEventCreateWithFlags");
  }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace internal
}  // namespace tessera

#endif  // TESSERA_INDEX_RERANK_CUDA_DEVICE_BUFFER_H_
