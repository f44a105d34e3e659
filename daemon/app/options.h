// What a daemon is started with: one options struct per module, gathered in DaemonOptions,
// and the machine-dependent defaults filled in from the number of CPUs.
#ifndef GPUMOVE_DAEMON_APP_OPTIONS_H_
#define GPUMOVE_DAEMON_APP_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "daemon/cluster/cluster.h"
#include "daemon/core/prepared_pieces.h"
#include "daemon/core/transfer_scheduler.h"
#include "daemon/memory/pool.h"
#include "daemon/path/cuda_ipc/cuda_ipc_engine.h"
#include "daemon/path/file/file_engine.h"
#include "daemon/path/mpi/mpi_engine.h"
#include "daemon/path/mpi/mpi_transport.h"
#include "daemon/path/ucx/ucx_transport.h"
#include "daemon/server/call_limits.h"
#include "daemon/server/tls.h"
#include "daemon/staging/staging.h"

namespace gpumove {

// Where the gRPC server listens and where it says so.
struct ServeOptions {
  // "host:port" (port 0 picks a free one) or "unix:/path".
  std::vector<std::string> listen = {"127.0.0.1:7470"};
  // False when `listen` is the default: an MPI rank then picks a port of its own.
  bool listen_given = true;
  // When set, the first bound address is written here once the server is up.
  std::string port_file;
  // Prometheus /metrics on this host:port (port 0 picks one); empty: off.
  std::string metrics_listen;
  // TLS on the TCP addresses (unix sockets are guarded by their file mode).
  TlsOptions tls;
  // Bearer tokens (ParseTokenFile's format), re-read every auth_refresh; empty: open,
  // every caller anonymous.
  std::string auth_tokens;
  // Client certificates' identities (SAN or CN) as principals (ParseTokenFile's format
  // with the identity first), re-read every auth_refresh; needs tls.client_ca.
  std::string client_cert_principals;
  // Unix socket callers' uids (SO_PEERCRED) as principals: ParseTokenFile's format with a
  // uid or user name first, re-read every auth_refresh; needs a unix socket in `listen`.
  std::string unix_socket_principals;
  // Per-tenant quotas (ParseQuotaFile's format), re-read every auth_refresh; empty: none.
  std::string quotas;
  // Tenants' weights (ParseTenantWeights' format), re-read every auth_refresh; empty: all 1.
  std::string tenant_weights;
  absl::Duration auth_refresh = absl::Seconds(1);
  // Listen beyond this host with neither tokens nor client certificates.
  bool allow_insecure = false;
  // Server reflection and channelz: "on", "off", or "auto" (on for an open daemon, off
  // where callers need credentials: both answer without any, and channelz lists other
  // clients' addresses).
  std::string introspection = "auto";
  // A connection that has not finished its TLS and HTTP/2 handshakes this long after it
  // was accepted is closed; one with no call this long is closed (gracefully).
  absl::Duration handshake_timeout = absl::Seconds(10);
  absl::Duration max_connection_idle = absl::Hours(1);
  // Pings on a connection with no traffic this often (dead clients' connections end).
  absl::Duration keepalive = absl::Minutes(2);
  // The largest message a call may send or receive (RESOURCE_EXHAUSTED past it).
  uint64_t max_message_size = 64 << 20;
  // Unix sockets' mode and group (empty: the daemon's): who on this host may connect.
  uint32_t unix_socket_mode = 0660;
  std::string unix_socket_group;
  // gRPC's synchronous server: its completion queues and, per queue, the threads waiting
  // for calls. A thread that ends a call goes back to waiting while fewer than
  // max_pollers wait, else it exits; fewer than min_pollers waiting starts one. 0: gRPC's
  // own (1 queue, 1 to 2 threads); a max below the min is raised to it.
  int completion_queues = 0;
  int min_pollers = 0;
  int max_pollers = 0;
};

// The UCX transport's options as the daemon starts it: its progress thread polls for a
// while after activity, and the machine picks the copy threads and how long a peer call
// keeps it awake (WithMachineDefaults).
inline UcxOptions DaemonUcxDefaults() {
  UcxOptions o;
  o.poll_window = absl::Milliseconds(1);  // 1 ms was best even on 2 CPUs (tuning.md).
  o.call_awake = absl::Milliseconds(-1);  // Negative: 10 ms with 16 CPUs or more, 0 below.
  o.direct_threads = 0;                   // 0: a quarter of the CPUs, at most 8.
  return o;
}

// The UCX path: the engine, its transports (the first and the lanes) and peer calls over
// active messages. Without it a node still joins a cluster and routes requests.
struct UcxPathOptions {
  bool enabled = true;
  // The first transport's; the lanes take its chunk and polling. Its op_timeout is the
  // cluster's peer_timeout and its net_devices the setting below.
  UcxOptions transport = DaemonUcxDefaults();
  // UCX_NET_DEVICES; "auto": "lo" when every listen address is on this host (loopback
  // or a unix socket), so UCX listens where gRPC does; else UCX's default, every device.
  std::string net_devices = "auto";
  // Host pools in memory UCX allocates (shared with daemons on this host when UCX has a
  // shared-memory allocator), not in private anonymous memory.
  bool shared_pools = true;
  // The moving side's calls to peers (holds, acknowledgements, staging and MPI steps) as
  // UCX active messages where both nodes have UCX, not gRPC.
  bool peer_calls = true;
  // How long a thread serving peer calls polls for the next one after serving; negative:
  // the transport's poll_window with 16 CPUs or more, a fifth of it below.
  absl::Duration peer_call_poll = absl::Milliseconds(-1);
  // Stage every range peers move to or from this node, not only device memory (exercises
  // the staging protocol on machines without GPUs).
  bool force_staging = false;
  // The transport class moves to other hosts must use ("rdma", "tcp"; empty: any).
  std::string require;
  // Lanes (each its own context, worker, connections and progress thread) that host
  // moves over the wire are split over; 0: one per 8 CPUs, 1 to 4.
  int lanes = 0;
  uint64_t lane_share = 512 << 10;  // Smallest share of a split move.
  // Rails (--ucx_rails): "" none; "auto" every active RDMA port when there are two or
  // more; else UCX device names. With rails, lanes 1.. are one a rail (their
  // UCX_NET_DEVICES that device), a move's shares go over them, and the first transport
  // is the spare a failed rail's share moves to.
  std::string rails;
};

// Path FILE_IO: where FILE buffers may be registered (FileRoots::Create's spec), and its
// engine.
struct FilePathOptions {
  std::string roots;
  FileEngineOptions engine;
};

// The CUDA IPC path, both sides.
struct CudaIpcPathOptions {
  bool fences = true;  // Peers' CUDA IPC copies may end behind a fence we wait for.
  // Our CUDA IPC moves of this many bytes or more may end behind a fence.
  uint64_t fence_min = CudaIpcEngine::kDefaultMinFenced;
  // Bytes/s; see IpcTailReader's quiet_rate.
  uint64_t fence_quiet = 1000ull * 1000 * 1000 * 1000;
};

// The MPI path. As a rank, the node is named rank<N> unless DaemonOptions::node is given
// ("%r" in it and in the port file becomes the rank), peers are the other ranks, and
// without a listen address given it listens on 127.0.0.1:(7470 + rank on this host).
struct MpiPathOptions {
  // "auto" (when an MPI launcher started us), "on" (fail without it) or "off".
  std::string mode = "auto";
  // The MPI thread's polling; its op_timeout follows the cluster's peer_timeout and its
  // spin the setting below.
  MpiOptions transport;
  // MpiOptions::spin; unset: on with 16 CPUs or more.
  std::optional<bool> spin;
  MpiEngineOptions engine;  // Message size, staging.
};

// Everything a daemon is started with, one struct per module: a new flag touches its
// module's struct and daemon/app/flags.cc.
struct DaemonOptions {
  std::string node;  // Empty: the host name.
  PoolSizes pools;
  // "all", "none", or a comma list of GPU indexes and/or UUIDs.
  std::string gpus = "all";
  absl::Duration default_lease = absl::ZeroDuration();
  // Device memory that exportable buffers (an allocation each) may take per GPU.
  uint64_t exportable_bytes_per_gpu = uint64_t{4} << 30;
  // "auto" (zero each pool allocation when callers need credentials: several tenants share
  // the pools), "always" or "never".
  std::string scrub_memory = "auto";
  // SetPoolIdleSpin, for the whole process; negative: 1 ms with 16 CPUs or more, 0 below.
  absl::Duration pool_spin = absl::Milliseconds(-1);
  ServeOptions serve;
  // Its node and on_end are the daemon's.
  SchedulerOptions scheduler;
  // Notifications kept per tenant for subscribers that resume (NotificationLog).
  size_t notification_log = 16384;
  // Each tenant's bounds on prepared piece lists (--max_prepared_lists/_pieces).
  PreparedPieceLists::Limits prepared;
  // Streams and waits open at once, in all and per principal (--max_open_calls...).
  CallLimits call_limits;
  // Peers to join (host:port or DNS name:port), heartbeat and failure detection; its
  // check is the daemon's (peers' UCX addresses).
  ClusterOptions cluster;
  // The address to advertise to peers; empty: the first bound TCP address.
  std::string advertise;
  // How this node dials peers. Unset with TLS serving: the client CA and this node's own
  // certificate (one cluster CA signing every node's certificate).
  PeerTlsOptions peer_tls;
  // A file holding the secret every node of the cluster has: peer calls are authenticated
  // with it (PeerAuth). Empty: peer calls are taken from anyone, unless the daemon's
  // clients need credentials, when it takes no peers.
  std::string cluster_secret_file;
  // A second secret taken (not signed with) besides it, for rotating the secret without a
  // restart; both files are re-read every serve.auth_refresh. Empty (or a file of only
  // whitespace): none.
  std::string cluster_secret_accept_file;
  // How far a peer call's clock may be from this node's.
  absl::Duration peer_clock_skew = absl::Minutes(2);
  UcxPathOptions ucx;
  // Bounce buffers of staged UCX moves (this node's own and those it holds for peers).
  StagingOptions staging;
  CudaIpcPathOptions cuda_ipc;
  MpiPathOptions mpi;
  FilePathOptions file;
};

// `options` with every machine-dependent default made this machine's (`cpus` CPUs): the
// negative durations, 0 counts and unset choices above that say "depends on the machine".
// The one place where the number of CPUs picks a default.
DaemonOptions WithMachineDefaults(DaemonOptions options, unsigned cpus);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_APP_OPTIONS_H_
