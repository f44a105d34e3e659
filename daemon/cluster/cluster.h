// Cluster membership: which other daemons exist, whether they are up, and how to reach
// them. Peers come from --peers (host:port, or a DNS name resolving to several addresses,
// as a Kubernetes headless Service does) and from any daemon that says Hello to us.
// A heartbeat thread says Hello to every known address; a peer that does not answer for
// peer_timeout is down, and a changed incarnation means it restarted. Either way the
// listeners hear that the old incarnation is gone.
#ifndef GPUMOVE_DAEMON_CLUSTER_CLUSTER_H_
#define GPUMOVE_DAEMON_CLUSTER_CLUSTER_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/cluster/path_hello.h"
#include "daemon/cluster/peer_auth.h"
#include "proto/gpumove/peer/v1/peer.grpc.pb.h"

namespace gpumove {

struct ClusterOptions {
  // host:port, name:port (every address the name resolves to) or unix:/path.
  std::vector<std::string> peers;
  // The paths this node runs that read peers' Hello blobs (path_hello.h); they must
  // outlive the cluster. A descriptor one of them refuses is not learned.
  std::vector<const PathHello*> paths;
  absl::Duration heartbeat = absl::Milliseconds(500);
  absl::Duration peer_timeout = absl::Seconds(3);
  absl::Duration dns_refresh = absl::Seconds(5);
  // The longest a call forwarded to another node may take when it does not wait for a
  // transfer (ForwardedCall).
  absl::Duration forward_timeout = absl::Seconds(10);
  // How this node dials peers (TLS where their ports are); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // With TLS credentials: the name peers' certificates are checked for (empty: the host
  // of the address dialled).
  std::string tls_server_name;
  // Stamps this node's peer calls and checks the answers (null: no cluster secret).
  std::shared_ptr<PeerAuth> auth;
};

// What the rest of the daemon may know of a peer.
struct PeerView {
  std::string node;
  std::string address;
  bool up = false;
  absl::Time last_seen = absl::InfinitePast();
  peer::v1::NodeDescriptor descriptor;
  std::shared_ptr<grpc::Channel> channel;
  // What each path this node runs made of the peer's blob (PathHello::Read), by path
  // name; none for a path the peer did not describe.
  std::vector<std::pair<std::string, std::shared_ptr<const PathView>>> paths;

  // `name`'s view, when the peer described that path and the view is a `View`.
  template <class View>
  const View* path(absl::string_view name) const {
    for (const auto& [n, view] : paths) {
      if (n == name) return dynamic_cast<const View*>(view.get());
    }
    return nullptr;
  }
};

class Cluster {
 public:
  using LostCallback = std::function<void(const std::string& node, uint64_t incarnation)>;

  Cluster(ClusterOptions options, peer::v1::NodeDescriptor self);
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // Starts the heartbeat thread. `on_lost` runs (on that thread) for each peer
  // incarnation that went down or was replaced by a restart.
  void Start(LostCallback on_lost);

  peer::v1::NodeDescriptor self() const;
  // The address peers should use, once the server is bound (before Start).
  void SetAdvertisedAddress(const std::string& address);
  // More peer addresses to keep meeting, as if given in options.peers (learned at start
  // by the composition root, as a job's other members).
  void AddPeers(const std::vector<std::string>& addresses);
  // An incoming Hello: the caller is a peer from now on. Returns the addresses of the
  // other nodes we know, for the caller to meet. INVALID_ARGUMENT, and nothing learned,
  // for a descriptor that CheckDescriptor or the options' check refuses.
  absl::StatusOr<std::vector<std::string>> OnHello(const peer::v1::NodeDescriptor& from);
  // NOT_FOUND for a node never seen, UNAVAILABLE for one that is down.
  absl::StatusOr<PeerView> Find(const std::string& node) const;
  std::vector<PeerView> List() const;
  // Whether `node` is up at `incarnation` and `match` holds for what is known of it (run
  // under the cluster's lock: it must not call back in). Nothing is copied: for hot paths.
  bool Matches(const std::string& node, uint64_t incarnation,
               const std::function<bool(const PeerView&)>& match) const;
  // A channel to any address (cached).
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address);
  absl::Duration forward_timeout() const { return options_.forward_timeout; }
  PeerAuth* auth() const { return options_.auth.get(); }

  // Runs `lost` once, on the heartbeat thread, when `node` is seen down or restarted (at
  // once, on this thread, when it is down now), unless Forget(id) came first. For calls
  // to a node that must not outlive it.
  uint64_t WatchLoss(const std::string& node, std::function<void()> lost);
  // Once it returns, the callback of `id` neither runs nor is running.
  void Forget(uint64_t id);

 private:
  struct Peer {
    PeerView view;
    std::vector<std::string> addresses;  // Addresses that answered as this node.
  };

  void HeartbeatLoop();
  // A Hello to `address`: what the node there says of itself.
  absl::StatusOr<peer::v1::NodeDescriptor> Probe(const std::string& address,
                                                 absl::Duration timeout);
  std::vector<std::string> Targets();
  absl::Status Learn(const peer::v1::NodeDescriptor& d, const std::string& via)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Each path's view of `d`'s blobs: read by the paths, except those kept from the same
  // incarnation's identical blob. INVALID_ARGUMENT when a path refuses its blob.
  absl::StatusOr<std::vector<std::pair<std::string, std::shared_ptr<const PathView>>>> ReadPaths(
      const peer::v1::NodeDescriptor& d) ABSL_LOCKS_EXCLUDED(mu_);

  const ClusterOptions options_;
  const std::string node_;
  LostCallback on_lost_;

  mutable absl::Mutex mu_;
  peer::v1::NodeDescriptor self_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);  // By node.
  std::vector<std::string> resolved_ ABSL_GUARDED_BY(mu_);             // From --peers.
  std::vector<std::string> gossiped_ ABSL_GUARDED_BY(mu_);             // From Hello answers.
  std::vector<std::string> added_ ABSL_GUARDED_BY(mu_);                // From AddPeers.
  absl::Time resolved_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, uint64_t>> lost_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread heartbeat_;

  // WatchLoss callbacks; their own lock, held while they run (never with mu_).
  struct LossWatch {
    std::string node;
    std::function<void()> lost;
  };
  absl::Mutex watch_mu_;
  absl::flat_hash_map<uint64_t, LossWatch> watches_ ABSL_GUARDED_BY(watch_mu_);
  uint64_t next_watch_ ABSL_GUARDED_BY(watch_mu_) = 1;
};

// Expands one --peers entry into addresses: a literal address is itself; a name is
// resolved (A and AAAA records). INVALID_ARGUMENT without a port, UNAVAILABLE when the
// name does not resolve.
absl::StatusOr<std::vector<std::string>> ResolvePeer(const std::string& spec);

// Limits on what a peer says of itself: a name, an address, and its paths' blobs (their
// count, names and sizes, one blob per path). INVALID_ARGUMENT saying which.
absl::Status CheckDescriptor(const peer::v1::NodeDescriptor& d);

// Random id for this process's life, and the machine's boot id + host name.
uint64_t NewIncarnation();
std::string HostId();

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_CLUSTER_CLUSTER_H_
