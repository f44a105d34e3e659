// A path's own part of a node's Hello (NodeDescriptor.paths): one opaque blob per path,
// packed by the path on the node that runs it and read by the same path on its peers, as
// NIXL's backends pack and read their own connection info. The cluster bounds the blobs,
// hands each to the path this node runs under that name once when a peer's Hello is
// accepted, and keeps what the path made of it with the peer's descriptor (PeerView), for
// the life of that incarnation; it never reads one itself.
#ifndef GPUMOVE_DAEMON_CLUSTER_PATH_HELLO_H_
#define GPUMOVE_DAEMON_CLUSTER_PATH_HELLO_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpumove {

// Bounds on NodeDescriptor.paths: entries, a path's name, one blob.
inline constexpr size_t kMaxHelloPaths = 8;
inline constexpr size_t kMaxHelloPathName = 64;
inline constexpr size_t kMaxHelloDetails = size_t{1} << 20;

// What a path made of a peer's blob; each path derives its own.
class PathView {
 public:
  virtual ~PathView() = default;
};

class PathHello {
 public:
  virtual ~PathHello() = default;
  // The name its blob travels under (at most kMaxHelloPathName bytes).
  virtual absl::string_view path() const = 0;
  // This node's blob.
  virtual std::string Pack() const = 0;
  // A peer's blob, parsed and checked: what this path reads for every move to that peer
  // incarnation. INVALID_ARGUMENT for a blob it cannot take (the Hello is then refused).
  virtual absl::StatusOr<std::shared_ptr<const PathView>> Read(absl::string_view blob) const = 0;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_CLUSTER_PATH_HELLO_H_
