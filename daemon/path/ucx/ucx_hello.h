// Path UCX's part of a node's Hello: this node's worker address, its pools registered with
// UCX (their remote keys) and its lanes, packed as a UcxDetails blob (ucx_hello.proto);
// and a peer's blob, checked once when its Hello is accepted (UCX trusts what it is given:
// ucx_wire_check.h) and kept as that peer incarnation's UcxView.
#ifndef GPUMOVE_DAEMON_PATH_UCX_HELLO_H_
#define GPUMOVE_DAEMON_PATH_UCX_HELLO_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/cluster/cluster.h"
#include "daemon/cluster/path_hello.h"
#include "daemon/memory/pool.h"
#include "daemon/path/ucx/ucx_hello.pb.h"
#include "daemon/path/ucx/ucx_transport.h"
#include "daemon/path/ucx/ucx_wire_check.h"

namespace gpumove {

inline constexpr char kUcxHelloPath[] = "ucx";

// A peer's UCX details, as checked when its Hello was accepted.
struct UcxView : PathView {
  peer::v1::UcxDetails details;
};

// `peer`'s UCX details; null when it has no UCX engine (or this node has none).
inline const peer::v1::UcxDetails* UcxDetailsOf(const PeerView& peer) {
  const UcxView* view = peer.path<UcxView>(kUcxHelloPath);
  return view != nullptr ? &view->details : nullptr;
}

// Whether `peer` serves peer calls as UCX active messages at `worker_address`.
bool ServesUcxCalls(const PeerView& peer, absl::string_view worker_address);

class UcxHello : public PathHello {
 public:
  // Registers `pools` with `ucx` and with each lane (the same pools, in the same order;
  // device pools only with a UCX that takes device memory): this node's details.
  static absl::StatusOr<std::unique_ptr<UcxHello>> Register(
      UcxTransport& ucx, const std::vector<UcxTransport*>& lanes, const PoolSet& pools,
      bool peer_calls);
  // This node's `self`; peers' worker addresses are checked against the shape of its own
  // (`shape`), or, null, only bounded (a packing ucx_wire_check.h does not know).
  UcxHello(peer::v1::UcxDetails self, std::shared_ptr<const UcxAddressShape> shape);

  absl::string_view path() const override { return kUcxHelloPath; }
  std::string Pack() const override { return self_.SerializeAsString(); }
  absl::StatusOr<std::shared_ptr<const PathView>> Read(absl::string_view blob) const override;

  const peer::v1::UcxDetails& self() const { return self_; }

 private:
  const peer::v1::UcxDetails self_;
  const std::shared_ptr<const UcxAddressShape> shape_;
};

// The shape of this node's own worker addresses (`self`'s, its lanes'); null, with a
// warning, when one does not parse.
std::shared_ptr<const UcxAddressShape> OwnAddressShape(const peer::v1::UcxDetails& self);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_UCX_HELLO_H_
