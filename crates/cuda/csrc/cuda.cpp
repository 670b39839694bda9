// CUDA device facts and the caching allocator's statistics, as torch.cuda reports them
// (get_device_properties, max_memory_allocated, max_memory_reserved, reset_peak_memory_stats).
// Every call returns 0 on success; without CUDA support compiled in, or on any C++ exception,
// nonzero.
#include <cstdint>
#include <cstring>

#ifdef FLOWTUNE_CUDA
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

extern "C" {

int ftc_compiled_with_cuda() {
#ifdef FLOWTUNE_CUDA
  return 1;
#else
  return 0;
#endif
}

// Name (NUL-terminated, at most `len` bytes), total memory in bytes, compute capability.
int ftc_device_properties(int device, char* name, int len, uint64_t* total, int* major,
                          int* minor) {
#ifdef FLOWTUNE_CUDA
  try {
    const auto* p = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device));
    std::strncpy(name, p->name, static_cast<size_t>(len) - 1);
    name[len - 1] = '\0';
    *total = static_cast<uint64_t>(p->totalGlobalMem);
    *major = p->major;
    *minor = p->minor;
    return 0;
  } catch (...) {
    return 1;
  }
#else
  (void)device, (void)name, (void)len, (void)total, (void)major, (void)minor;
  return 1;
#endif
}

// Peak bytes allocated to tensors and reserved by the allocator since the last reset.
int ftc_memory_peaks(int device, uint64_t* allocated, uint64_t* reserved) {
#ifdef FLOWTUNE_CUDA
  try {
    using c10::CachingAllocator::StatType;
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
        static_cast<c10::DeviceIndex>(device));
    auto aggregate = static_cast<size_t>(StatType::AGGREGATE);
    *allocated = static_cast<uint64_t>(stats.allocated_bytes[aggregate].peak);
    *reserved = static_cast<uint64_t>(stats.reserved_bytes[aggregate].peak);
    return 0;
  } catch (...) {
    return 1;
  }
#else
  (void)device, (void)allocated, (void)reserved;
  return 1;
#endif
}

int ftc_reset_peaks(int device) {
#ifdef FLOWTUNE_CUDA
  try {
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
    return 0;
  } catch (...) {
    return 1;
  }
#else
  (void)device;
  return 1;
#endif
}

}  // extern "C"
