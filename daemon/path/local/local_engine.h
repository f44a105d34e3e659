// Path LOCAL: moves inside one daemon. memcpy between host memories, cudaMemcpyAsync
// between host and GPU, peer copies (NVLink where present) between its GPUs.
#ifndef GPUMOVE_DAEMON_PATH_LOCAL_ENGINE_H_
#define GPUMOVE_DAEMON_PATH_LOCAL_ENGINE_H_

#include "daemon/core/engine.h"
#include "daemon/gpu/gpu.h"

namespace gpumove {

class LocalEngine : public Engine {
 public:
  // `gpu` must outlive the engine.
  explicit LocalEngine(GpuRuntime* gpu) : gpu_(gpu) {}

  PathKind path() const override { return PathKind::kLocal; }
  absl::Status CanServe(const Endpoint& src, const Endpoint& dst) const override;
  absl::Status Move(const Endpoint& src, const Endpoint& dst, uint64_t length,
                    MoveControl& control) override;
  bool MovesPieces(const Endpoint& src, const Endpoint& dst) const override { return true; }
  // Host to host: the pieces split over the copy threads. With device memory: one copy
  // per piece for now (the gather kernel of issue 26 is to come).
  absl::Status MovePieces(const Endpoint& src, const Endpoint& dst, const Segments& pieces,
                          MoveControl& control) override;

 private:
  GpuRuntime* const gpu_;
};

// xxh3-64 of `length` bytes at `e`. Device memory from kGpuHashMin bytes: the sums of its
// 1 KiB blocks on its GPU, the rest on the CPU (daemon/common/xxh3_split.h), the same
// xxh3 as the host's; shorter ranges, or a runtime without the kernel: copied to the host
// (two page-locked bounces, the copy of one overlapping the hash of the other).
absl::StatusOr<uint64_t> HashRange(GpuRuntime* gpu, const Endpoint& e, uint64_t length);
inline constexpr uint64_t kGpuHashMin = 1 << 20;
// xxh3-64 of the pieces' bytes at `e` one after another in list order: their source
// sides (`source`) or destination sides. The same bytes hash the same as HashRange of
// their concatenation.
absl::StatusOr<uint64_t> HashPieces(GpuRuntime* gpu, const Endpoint& e, const Segments& pieces,
                                    bool source);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_LOCAL_ENGINE_H_
