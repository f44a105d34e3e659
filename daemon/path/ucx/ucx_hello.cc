#include "daemon/path/ucx/ucx_hello.h"

#include <utility>

#include "daemon/common/log.h"
#include "daemon/peer/kinds.h"

namespace gpumove {

bool ServesUcxCalls(const PeerView& peer, absl::string_view worker_address) {
  const peer::v1::UcxDetails* ucx = UcxDetailsOf(peer);
  return ucx != nullptr && ucx->peer_calls() && !ucx->worker_address().empty() &&
         ucx->worker_address() == worker_address;
}

absl::StatusOr<std::unique_ptr<UcxHello>> UcxHello::Register(
    UcxTransport& ucx, const std::vector<UcxTransport*>& lanes, const PoolSet& pools,
    bool peer_calls) {
  peer::v1::UcxDetails self;
  self.set_worker_address(ucx.worker_address());
  self.set_cuda_aware(ucx.cuda_aware());
  self.set_peer_calls(peer_calls);
  for (const auto& pool : pools.pools()) {
    // Device memory is only registered with a UCX that takes it.
    if (pool->kind() == MemoryKind::kDevice && !ucx.cuda_aware()) continue;
    auto rkey = ucx.Register(pool->base(), pool->capacity());
    if (!rkey.ok()) return rkey.status();
    peer::v1::RegisteredPool* p = self.add_pools();
    p->set_kind(ToProto(pool->kind()));
    p->set_device(pool->device());
    p->set_base(reinterpret_cast<uint64_t>(pool->base()));
    p->set_size(pool->capacity());
    p->set_rkey(*rkey);
  }
  // Each lane registers the same pools in its own context, in the same order.
  for (UcxTransport* lane : lanes) {
    peer::v1::UcxLane* l = self.add_lanes();
    l->set_worker_address(lane->worker_address());
    for (const peer::v1::RegisteredPool& p : self.pools()) {
      auto rkey = lane->Register(reinterpret_cast<void*>(p.base()), p.size());
      if (!rkey.ok()) return rkey.status();
      l->add_rkeys(*rkey);
    }
  }
  std::shared_ptr<const UcxAddressShape> shape = OwnAddressShape(self);
  return std::make_unique<UcxHello>(std::move(self), std::move(shape));
}

std::shared_ptr<const UcxAddressShape> OwnAddressShape(const peer::v1::UcxDetails& self) {
  // A peer's UCX addresses reach ucp_ep_create, which trusts them: checked against the
  // shape of this node's own.
  auto shape = std::make_shared<UcxAddressShape>();
  absl::Status learned = shape->Learn(self.worker_address());
  for (const peer::v1::UcxLane& lane : self.lanes()) {
    if (learned.ok()) learned = shape->Learn(lane.worker_address());
  }
  if (!learned.ok()) {
    // A packing this check does not know (UCX_UNIFIED_MODE, a newer UCX): peers' would
    // not parse either.
    LOG(WARNING) << "peers' UCX addresses go unchecked: this node's own does not parse ("
                 << learned.message() << ")";
    return nullptr;
  }
  return shape;
}

UcxHello::UcxHello(peer::v1::UcxDetails self, std::shared_ptr<const UcxAddressShape> shape)
    : self_(std::move(self)), shape_(std::move(shape)) {}

absl::StatusOr<std::shared_ptr<const PathView>> UcxHello::Read(absl::string_view blob) const {
  auto view = std::make_shared<UcxView>();
  if (!view->details.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
    return absl::InvalidArgumentError("not a UcxDetails message");
  }
  if (absl::Status st = CheckUcxDetails(view->details, shape_.get()); !st.ok()) return st;
  return std::shared_ptr<const PathView>(std::move(view));
}

}  // namespace gpumove
