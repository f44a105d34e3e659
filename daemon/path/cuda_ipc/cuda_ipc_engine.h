// Path CUDA_IPC: moves between this node and another daemon on the same host, GPU to
// GPU. The remote node hands out its device range's CUDA IPC handle in PrepareRemote;
// this node maps the allocation once (cached per peer incarnation) and copies with
// cudaMemcpyAsync between the two device pointers, so bytes never touch host memory.
// Same host is detected (host id in Hello), not configured.
#ifndef GPUMOVE_DAEMON_PATH_CUDA_IPC_ENGINE_H_
#define GPUMOVE_DAEMON_PATH_CUDA_IPC_ENGINE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "daemon/core/engine.h"
#include "daemon/gpu/gpu.h"
#include "daemon/gpu/ipc.h"
#include "daemon/path/cuda_ipc/cuda_ipc_protocol.h"

namespace gpumove {

class CudaIpcEngine : public Engine {
 public:
  // Both must outlive the engine. Moves of `min_fenced` bytes or more end with their
  // copy still running behind a fence (the move's tail) when the other node can see it
  // land (MoveControl::AcceptsTail); smaller ones copy to the end first.
  CudaIpcEngine(GpuRuntime* gpu, IpcTable* ipc, uint64_t min_fenced = kDefaultMinFenced,
                uint64_t chunk = 64 << 20)
      : gpu_(gpu), ipc_(ipc), min_fenced_(min_fenced), chunk_(chunk) {}
  static constexpr uint64_t kDefaultMinFenced = 4ull << 20;

  PathKind path() const override { return PathKind::kCudaIpc; }
  absl::Status CanServe(const Endpoint& src, const Endpoint& dst) const override;
  absl::Status Move(const Endpoint& src, const Endpoint& dst, uint64_t length,
                    MoveControl& control) override;
  // Vectored: the gather kernel on this node's GPU, reading or writing the peer's mapped
  // range (GpuRuntime::CopyPieces), ended before the acknowledgement (no fence).
  bool MovesPieces(const Endpoint& src, const Endpoint& dst) const override { return true; }
  absl::Status MovePieces(const Endpoint& src, const Endpoint& dst, const Segments& pieces,
                          MoveControl& control) override;

  // Drops the mappings of a peer incarnation that went away.
  void Forget(const std::string& node, uint64_t incarnation);

 private:
  // The GPU of ours on which to map the remote range: the local end's GPU (which issues
  // the copy) when it is that GPU or reaches it with peer copies, else the remote range's
  // own GPU when we see it; -1 when neither.
  int MapDevice(const CudaIpcOffer& remote, const Endpoint& local) const;
  // The remote range of a move of `length` bytes mapped on `*device` (kept for the
  // peer's life): its first byte here.
  absl::StatusOr<char*> MapRemote(const RemoteHold& remote, const Endpoint& local,
                                  uint64_t length, int* device,
                                  std::shared_ptr<const IpcTable::Mapping>* mapping);

  GpuRuntime* const gpu_;
  IpcTable* const ipc_;
  static constexpr uint64_t kMaxChunk = 1ull << 30;
  const uint64_t min_fenced_;
  const uint64_t chunk_;
  absl::Mutex mu_;
  // Mappings kept open per peer incarnation.
  absl::flat_hash_map<PeerId, std::vector<std::shared_ptr<const IpcTable::Mapping>>> held_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_CUDA_IPC_ENGINE_H_
