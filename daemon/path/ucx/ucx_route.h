// What UCX chose to reach a peer: each lane's transport and device and the roles UCX gave
// it, read from ucp_ep_print_info (UCX 1.13 has no ucp_ep_query for transports). A move
// records the transports that carried its bytes ("rc_verbs/rxe0:1"), so that a silent
// fallback to TCP shows in the transfer, its metrics, and can be refused.
#ifndef GPUMOVE_DAEMON_PATH_UCX_ROUTE_H_
#define GPUMOVE_DAEMON_PATH_UCX_ROUTE_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace gpumove {

struct UcxLaneInfo {
  std::string transport;           // "rc_verbs", "tcp", "cma", ...
  std::string device;              // "rxe0:1", "eth0", "memory", ...
  std::vector<std::string> roles;  // "am", "am_bw#0", "rma_bw#0", "rma#0", "wireup", ...
};

struct UcxRoute {
  std::vector<UcxLaneInfo> lanes;
  // "transport/device" of the lanes that carry a move's bytes (an rma, rma_bw or am_bw
  // role; every lane when none has one), each once, in lane order.
  std::vector<std::string> carriers;
  // Whether a carrier is of `kind` (UcxTransportClass).
  bool Carries(absl::string_view kind) const;
  // The carriers joined by ','.
  std::string Summary() const;
};

// Reads ucp_ep_print_info's text: its "lane[N]: I:transport/device.P md[..] -> ... roles"
// lines (other lines are ignored; a line that does not parse is skipped). At most 64 lanes,
// names at most 64 bytes each.
UcxRoute ParseUcxRoute(absl::string_view text);

// The class of a UCX transport name: "rdma" (InfiniBand/RoCE verbs: rc_*, dc_*, ud_*),
// "tcp", "shm" (sysv, posix, cma, knem, xpmem), "cuda" (cuda_ipc, cuda_copy, gdr_copy),
// "self", or "other".
std::string UcxTransportClass(absl::string_view transport);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_UCX_ROUTE_H_
