// Path UCX: moves between this node and another over UCX RMA. A push puts local bytes
// into the peer's registered pool and flushes; a pull gets them. Host and pinned memory
// go zero-copy from pool to pool; device memory needs a CUDA-aware UCX (staging through
// pinned bounce buffers is not built yet, so without one such moves are refused).
#ifndef GPUMOVE_DAEMON_PATH_UCX_ENGINE_H_
#define GPUMOVE_DAEMON_PATH_UCX_ENGINE_H_

#include "daemon/core/engine.h"
#include "daemon/path/ucx_transport.h"

namespace gpumove {

class UcxEngine : public Engine {
 public:
  // `transport` must outlive the engine.
  explicit UcxEngine(UcxTransport* transport) : transport_(transport) {}

  PathKind path() const override { return PathKind::kUcx; }
  absl::Status CanServe(const Endpoint& src, const Endpoint& dst) const override;
  absl::Status Move(const Endpoint& src, const Endpoint& dst, uint64_t length,
                    MoveControl& control) override;

  // The key under which the transport caches a peer incarnation's endpoint.
  static std::string PeerKey(const std::string& node, uint64_t incarnation);

 private:
  UcxTransport* const transport_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_UCX_ENGINE_H_
