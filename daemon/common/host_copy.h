// Host-to-host copy for large ranges.
#ifndef GPUMOVE_DAEMON_COMMON_HOST_COPY_H_
#define GPUMOVE_DAEMON_COMMON_HOST_COPY_H_

#include <cstddef>
#include <cstdint>
#include <functional>

namespace gpumove {

// Copies n bytes between non-overlapping host ranges. From kStreamingCopyMin bytes up it
// uses non-temporal (streaming) stores where the CPU has AVX2: such a range outgrows the
// caches and is rarely read back by this CPU soon, and skipping the read-for-ownership
// of every destination line beats glibc memcpy there (docs/performance/tuning.md). Below
// that (where the bytes may stay in cache, and memcpy wins),
// or without AVX2, it is memcpy. The stores are fenced before it returns. A caller whose
// destination no CPU reads next (a bounce buffer a GPU copy reads) passes a smaller
// `streaming_min`.
inline constexpr size_t kStreamingCopyMin = 8 << 20;
void HostCopy(void* dst, const void* src, size_t n, size_t streaming_min = kStreamingCopyMin);

// HostCopy split over up to `threads` threads (this one and a shared pool of helpers) in
// parts of at least kParallelCopyPart bytes: one thread cannot fill a big server's memory
// bandwidth.
// Streaming stores as for a HostCopy of all n bytes. Returns when every part is done.
void ParallelHostCopy(void* dst, const void* src, size_t n, int threads,
                      size_t streaming_min = kStreamingCopyMin);

// Runs job(0) on this thread and job(1) .. job(parts - 1) on the helper threads of
// ParallelHostCopy; returns when all are done.
void RunCopyParts(int parts, const std::function<void(int part)>& job);

// Bytes this process copied with streaming stores (HostCopy, ParallelHostCopy).
uint64_t StreamedCopyBytes();
// Bytes of ParallelHostCopy calls that helper threads copied (every part but the
// calling thread's).
uint64_t HelperCopyBytes();

inline constexpr size_t kParallelCopyPart = 512 << 10;

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_COMMON_HOST_COPY_H_
