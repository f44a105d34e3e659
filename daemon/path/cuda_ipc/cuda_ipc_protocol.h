// Path CUDA_IPC's part of the hold handshake: a holder that can share a device range over
// CUDA IPC offers its allocation's handle; a runner on the same host maps it.
#ifndef GPUMOVE_DAEMON_PATH_CUDA_IPC_PROTOCOL_H_
#define GPUMOVE_DAEMON_PATH_CUDA_IPC_PROTOCOL_H_

#include <cstdint>
#include <string>

#include "daemon/peer/path_codec.h"
#include "daemon/peer/path_holder.h"
#include "daemon/gpu/gpu.h"
#include "daemon/gpu/ipc.h"

namespace gpumove {

// The holder's allocation's handle, the range's offset in it and the GPU's UUID.
struct CudaIpcOffer : PathOffer {
  std::string handle;
  uint64_t offset = 0;
  std::string device_uuid;
};

class CudaIpcCodec : public PathCodec {
 public:
  void DecodeOffer(const PeerView& holder, const RemoteAsk& ask,
                   const peer::v1::PrepareRemoteResponse& response,
                   RemoteHold* hold) const override;
};

// Holding side: offers device ranges this node can share over CUDA IPC (its device pools,
// memory imported from clients), and, with `tails`, says this node reads the tails runners'
// acknowledgements carry (their copies may still run when they acknowledge;
// IpcTailReader).
class CudaIpcHolder : public PathHolder {
 public:
  // `ipc` and `gpu` must outlive this.
  CudaIpcHolder(IpcTable* ipc, GpuRuntime* gpu, bool tails)
      : ipc_(ipc), gpu_(gpu), tails_(tails) {}
  absl::StatusOr<std::unique_ptr<HoldPart>> Offer(
      const HoldContext& context, const BufferUse& range,
      peer::v1::PrepareRemoteResponse* response) override;

 private:
  IpcTable* const ipc_;
  GpuRuntime* const gpu_;
  const bool tails_;
};

// Holding side: offers a device range over CUDA IPC.
void OfferCudaIpc(const std::string& handle, uint64_t offset, const std::string& device_uuid,
                  peer::v1::PrepareRemoteResponse* response);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_CUDA_IPC_PROTOCOL_H_
