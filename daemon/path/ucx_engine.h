// Path UCX: moves between this node and another over UCX RMA. A push puts local bytes
// into the peer's registered pool and flushes; a pull gets them. Host and pinned memory
// go zero-copy from pool to pool. Local device memory goes direct with a CUDA-aware UCX,
// else through the staging pipeline (pinned bounce buffers, GPU copies overlapping the
// wire). Device memory on the remote side needs that side to stage, which is not built
// yet: such moves are refused with FAILED_PRECONDITION.
#ifndef GPUMOVE_DAEMON_PATH_UCX_ENGINE_H_
#define GPUMOVE_DAEMON_PATH_UCX_ENGINE_H_

#include "daemon/core/engine.h"
#include "daemon/gpu/gpu.h"
#include "daemon/memory/pool.h"
#include "daemon/path/staging.h"
#include "daemon/path/ucx_transport.h"

namespace gpumove {

class UcxEngine : public Engine {
 public:
  // All must outlive the engine; `pinned` (may be null: no staging) lends bounce buffers.
  UcxEngine(UcxTransport* transport, GpuRuntime* gpu, Pool* pinned, StagingOptions staging = {})
      : transport_(transport), gpu_(gpu), pinned_(pinned), staging_(staging) {}

  PathKind path() const override { return PathKind::kUcx; }
  absl::Status CanServe(const Endpoint& src, const Endpoint& dst) const override;
  absl::Status Move(const Endpoint& src, const Endpoint& dst, uint64_t length,
                    MoveControl& control) override;

  // The key under which the transport caches a peer incarnation's endpoint.
  static std::string PeerKey(const std::string& node, uint64_t incarnation);

 private:
  UcxTransport* const transport_;
  GpuRuntime* const gpu_;
  Pool* const pinned_;
  const StagingOptions staging_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_UCX_ENGINE_H_
