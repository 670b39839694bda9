// CUDA device facts and the caching allocator's statistics, as torch.cuda reports them
// (get_device_properties, max_memory_allocated, max_memory_reserved, reset_peak_memory_stats).
// Every call returns 0 on success; without CUDA support compiled in, or on any C++ exception,
// nonzero.
#include <cstdint>
#include <cstring>
#include <dlfcn.h>

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

// Free and total bytes of the device as the driver sees them (torch.cuda.mem_get_info). The
// runtime's functions are looked up in the process, where libtorch_cuda loaded them, so this
// library needs no link to a particular libcudart; the current device is restored.
int ftc_mem_get_info(int device, uint64_t* free_bytes, uint64_t* total_bytes) {
#ifdef FLOWTUNE_CUDA
  using GetDevice = int (*)(int*);
  using SetDevice = int (*)(int);
  using MemGetInfo = int (*)(size_t*, size_t*);
  auto get_device = reinterpret_cast<GetDevice>(dlsym(RTLD_DEFAULT, "cudaGetDevice"));
  auto set_device = reinterpret_cast<SetDevice>(dlsym(RTLD_DEFAULT, "cudaSetDevice"));
  auto mem_get_info = reinterpret_cast<MemGetInfo>(dlsym(RTLD_DEFAULT, "cudaMemGetInfo"));
  int previous = 0;
  if (get_device == nullptr || set_device == nullptr || mem_get_info == nullptr ||
      get_device(&previous) != 0 || set_device(device) != 0) {
    return 1;
  }
  size_t free = 0, total = 0;
  int failed = mem_get_info(&free, &total);
  set_device(previous);
  if (failed != 0) {
    return 1;
  }
  *free_bytes = static_cast<uint64_t>(free);
  *total_bytes = static_cast<uint64_t>(total);
  return 0;
#else
  (void)device, (void)free_bytes, (void)total_bytes;
  return 1;
#endif
}

}  // extern "C"
