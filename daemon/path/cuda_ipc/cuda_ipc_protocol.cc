#include "daemon/path/cuda_ipc/cuda_ipc_protocol.h"

#include <memory>

namespace gpumove {

void CudaIpcCodec::DecodeOffer(const PeerView& holder, const RemoteAsk& ask,
                               const peer::v1::PrepareRemoteResponse& response,
                               RemoteHold* hold) const {
  if (!response.has_cuda_ipc() || response.cuda_ipc().handle().empty()) return;
  auto offer = std::make_shared<CudaIpcOffer>();
  offer->handle = response.cuda_ipc().handle();
  offer->offset = response.cuda_ipc().offset();
  offer->device_uuid = response.cuda_ipc().device_uuid();
  hold->reads_tails = response.cuda_ipc().reads_tails();
  hold->offers.push_back(std::move(offer));
}

absl::StatusOr<std::unique_ptr<HoldPart>> CudaIpcHolder::Offer(
    const HoldContext& context, const BufferUse& range, peer::v1::PrepareRemoteResponse* response) {
  if (range.kind() != MemoryKind::kDevice) return nullptr;
  auto ref = ipc_->Find(range.data(), range.length());
  if (!ref.has_value()) return nullptr;
  std::string uuid;
  for (const GpuDevice& d : gpu_->devices()) {
    if (d.index == range.device()) uuid = d.uuid;
  }
  OfferCudaIpc(ref->handle, ref->offset, uuid, response);
  response->mutable_cuda_ipc()->set_reads_tails(tails_ && !gpu_->devices().empty());
  return nullptr;
}

void OfferCudaIpc(const std::string& handle, uint64_t offset, const std::string& device_uuid,
                  peer::v1::PrepareRemoteResponse* response) {
  peer::v1::CudaIpcOffer* offer = response->mutable_cuda_ipc();
  offer->set_handle(handle);
  offer->set_offset(offset);
  offer->set_device_uuid(device_uuid);
}

}  // namespace gpumove
