// Checks of the UCX objects a peer sends us (packed worker addresses and remote keys)
// before they reach UCX, which trusts them: a malformed worker address makes
// ucp_ep_create abort the process (an assertion in ucp_address_unpack) or read past the
// buffer, and a malformed remote key does the same in ucp_ep_rkey_unpack.
//
// The checks walk UCX's packed formats (worker address versions 1 and 2 in the default,
// non-unified mode; remote keys), as UCX 1.13 through 1.19 write them, with every length
// bounded by the buffer, and refuse anything that does not end exactly at its last byte.
// UCX's transports read their device and interface addresses without looking at their
// lengths, so an entry for a transport this node has must be at least as long as this
// node's own addresses have it (UcxAddressShape); entries for transports it lacks are
// never read by UCX. They need no UCX context: a node checks what it learns before it
// keeps it.
//
//   UcxAddressShape shape;
//   shape.Learn(own_worker_address);
//   RETURN_IF_ERROR(CheckUcxWorkerAddress(peer_address, &shape));
#ifndef GPUMOVE_DAEMON_PATH_UCX_WIRE_CHECK_H_
#define GPUMOVE_DAEMON_PATH_UCX_WIRE_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/path/ucx/ucx_hello.pb.h"

namespace gpumove {

inline constexpr size_t kMaxUcxWorkerAddress = 64 << 10;
inline constexpr size_t kMaxUcxRkey = 4 << 10;

// One transport interface of a packed worker address.
struct UcxAddressEntry {
  uint16_t transport = 0;  // Checksum of the transport's name.
  uint8_t device_length = 0;
  uint8_t iface_length = 0;
  int endpoints = 0;  // Endpoint addresses (a worker's own address has none).
};

// The entries of a well-formed packed worker address; INVALID_ARGUMENT saying where it
// is not well formed.
absl::StatusOr<std::vector<UcxAddressEntry>> ParseUcxWorkerAddress(absl::string_view address);

// What entries this node's own UCX writes: per transport, the device and interface
// address lengths (an entry fits when it has at least the shortest of them).
class UcxAddressShape {
 public:
  // Adds the entries of one of this node's own worker addresses.
  absl::Status Learn(absl::string_view own_address);
  bool Knows(uint16_t transport) const;
  bool Fits(const UcxAddressEntry& e) const;

 private:
  std::vector<std::tuple<uint16_t, uint8_t, uint8_t>> known_;
};

// OK when `address` is well formed and, with `shape`, each of its entries for a transport
// the shape knows fits it and has no endpoint addresses.
absl::Status CheckUcxWorkerAddress(absl::string_view address,
                                   const UcxAddressShape* shape = nullptr);

// OK when `rkey` is a well-formed ucp_rkey_pack output; INVALID_ARGUMENT otherwise.
absl::Status CheckUcxRkey(absl::string_view rkey);

// Bounds on a peer's UCX details: pools, and lanes besides its worker.
inline constexpr int kMaxUcxPools = 64;
inline constexpr int kMaxUcxLanes = 64;

// A peer's UCX details (its Hello blob): at most kMaxUcxPools pools and kMaxUcxLanes
// lanes, each lane a key per pool; with `shape`, every worker address (its own and its
// lanes') against it, and every pool key parsed. INVALID_ARGUMENT naming the first bad one.
absl::Status CheckUcxDetails(const peer::v1::UcxDetails& d, const UcxAddressShape* shape);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_UCX_WIRE_CHECK_H_
