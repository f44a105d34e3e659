// Path CUDA_IPC's part of the hold handshake: a holder that can share a device range over
// CUDA IPC offers its allocation's handle; a runner on the same host maps it.
#ifndef GPUMOVE_DAEMON_PATH_CUDA_IPC_PROTOCOL_H_
#define GPUMOVE_DAEMON_PATH_CUDA_IPC_PROTOCOL_H_

#include <cstdint>
#include <string>

#include "daemon/cluster/path_codec.h"

namespace gpumove {

// The holder's allocation's handle, the range's offset in it and the GPU's UUID.
struct CudaIpcOffer : PathOffer {
  std::string handle;
  uint64_t offset = 0;
  std::string device_uuid;
};

class CudaIpcCodec : public PathCodec {
 public:
  void DecodeOffer(const peer::v1::NodeDescriptor& holder, const peer::v1::NodeDescriptor& self,
                   const RemoteAsk& ask, const peer::v1::PrepareRemoteResponse& response,
                   RemoteHold* hold) const override;
};

// Holding side: offers a device range over CUDA IPC.
void OfferCudaIpc(const std::string& handle, uint64_t offset, const std::string& device_uuid,
                  peer::v1::PrepareRemoteResponse* response);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_CUDA_IPC_PROTOCOL_H_
