// Rails: the RDMA devices a node's UCX lanes are bound to, one device a lane, so that a
// move's shares go out through every NIC and a NIC that fails takes only its lane down
// (the move's share on it is sent again on the others: RunShares).
#ifndef GPUMOVE_DAEMON_PATH_UCX_UCX_RAILS_H_
#define GPUMOVE_DAEMON_PATH_UCX_UCX_RAILS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gpumove {

// The RDMA device ports whose state is ACTIVE under `sysfs`/class/infiniband, as UCX
// names them ("rxe0:1", "mlx5_0:1"), sorted by name; a RoCE port with its netdev as the
// rail's helper ("rxe0:1+eth0").
std::vector<std::string> ActiveRdmaPorts(const std::string& sysfs = "/sys");

// The rails `--ucx_rails` names: "" none (lanes as --ucx_lanes says); "auto" every
// active RDMA port when there are two or more (none otherwise); else a comma list of
// rails, each "DEVICE:PORT" with up to three "+HELPER" devices UCX may also use to
// connect the rail (a TCP netdev: without UD, which gpumove leaves out of UCX_TLS, an
// RDMA device alone cannot connect). At most kMaxRails, no repeats, [A-Za-z0-9_.-]
// device names. INVALID_ARGUMENT naming the first bad one.
inline constexpr size_t kMaxRails = 16;
absl::StatusOr<std::vector<std::string>> ParseUcxRails(const std::string& flag,
                                                       const std::string& sysfs = "/sys");

// A rail's UCX_NET_DEVICES: its devices, comma-separated.
std::string RailNetDevices(const std::string& rail);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_UCX_UCX_RAILS_H_
