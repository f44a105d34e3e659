// gpumoved's flags, one per option of its module's struct (see docs/operations.md for them
// in context), and the DaemonOptions they make. DaemonHelp lists the flags of this file.
#include "daemon/app/flags.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/strings/str_join.h"
#include "daemon/common/bytes.h"

ABSL_FLAG(std::vector<std::string>, listen, {"127.0.0.1:7470"},
          "Comma-separated addresses to serve on: host:port (port 0 picks a free one) or "
          "unix:/path/to/socket.");
ABSL_FLAG(std::string, node, "", "Node name, unique in the cluster (default: host name).");
ABSL_FLAG(gpumove::ByteSize, host_pool_size, gpumove::ByteSize{1ull << 30},
          "Pageable host pool size (e.g. 1GiB; 0 disables it).");
ABSL_FLAG(gpumove::ByteSize, pinned_pool_size, gpumove::ByteSize{256ull << 20},
          "Pinned host pool size (0 disables it).");
ABSL_FLAG(gpumove::ByteSize, device_pool_size, gpumove::ByteSize{1ull << 30},
          "Device pool size per GPU (0 disables device pools).");
ABSL_FLAG(std::string, gpus, "all",
          "GPUs to serve: all, none, or a comma list of indexes and/or UUIDs (GPU-...).");
ABSL_FLAG(absl::Duration, default_lease, absl::ZeroDuration(),
          "Lease for buffers allocated without one (0: no lease; they live until Release).");
ABSL_FLAG(gpumove::ByteSize, exportable_bytes_per_gpu, gpumove::ByteSize{4ull << 30},
          "GPU memory that exportable buffers (Allocate with exportable: an allocation of "
          "their own, whose CUDA IPC handle Export gives their owner) may take per GPU, "
          "outside the device pool (0: none).");
ABSL_FLAG(std::string, scrub_memory, "auto",
          "Zero each pool allocation before handing it out: auto (when callers need "
          "credentials, so tenants share the pools), always or never.");
ABSL_FLAG(bool, keep_cpu_binding, false,
          "Keep the CPU binding an MPI launcher gave this rank (mpirun binds two ranks or "
          "fewer to one core each). By default a daemon started by an MPI launcher lets its "
          "threads run on every CPU its cpuset allows.");
ABSL_FLAG(int, copy_threads, 4, "Worker threads running transfers.");
ABSL_FLAG(int, latency_copy_threads, 1,
          "Worker threads besides --copy_threads that run only latency-class moves (0 to 64): "
          "a latency move never waits for a bulk move to end.");
ABSL_FLAG(int, max_blocks_per_move, 1 << 20,
          "Pieces (segments or blocks) one vectored move may have; past it the Submit is "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(int, max_prepared_lists, 4096,
          "Prepared piece lists (TransferService.PreparePieces) one tenant may keep on this "
          "node; past it PreparePieces is RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_prepared_pieces, int64_t{1} << 22,
          "Pieces over all the prepared piece lists one tenant keeps on this node (about 24 "
          "bytes each, twice that for lists whose offsets do not start at 0).");
ABSL_FLAG(int, notification_log, 16384,
          "Notifications (TransferSpec.notify) kept per tenant for subscribers that resume; "
          "one that falls further behind is told how many it missed.");
ABSL_FLAG(int, max_active, 4096, "Transfers queued or running at once before Submit is refused.");
ABSL_FLAG(int, max_open_calls, 2048,
          "Streams and waits (Read, Write, Watch, Notifications, Wait; Submit and Cancel with "
          "wait) open at once (no thread each, but memory, listeners and a timer); more are "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(int, max_open_calls_per_principal, 512,
          "As --max_open_calls, for one principal (every caller of an open daemon is one).");
ABSL_FLAG(gpumove::ByteSize, max_move_rate, gpumove::ByteSize{0},
          "Per-transfer bandwidth cap in bytes per second (e.g. 1GiB); 0 means none.");
ABSL_FLAG(gpumove::ByteSize, inline_move_max, gpumove::ByteSize{64 << 10},
          "A lone move up to this size, submitted with wait, runs on the RPC's own thread "
          "(saves two thread hand-offs); 0 turns it off.");
ABSL_FLAG(absl::Duration, drain_grace, absl::Seconds(30),
          "On SIGTERM/SIGINT: how long running transfers get to finish before cancel.");
ABSL_FLAG(std::string, port_file, "",
          "Write the first bound address here once serving (for scripts and tests).");
ABSL_FLAG(std::vector<std::string>, peers, {},
          "Comma-separated peers to join: host:port, or name:port for every address a DNS "
          "name resolves to (a Kubernetes headless Service).");
ABSL_FLAG(std::string, advertise, "",
          "Address peers should use for this node (default: the first TCP --listen address).");
ABSL_FLAG(absl::Duration, heartbeat, absl::Milliseconds(500), "Interval of peer heartbeats.");
ABSL_FLAG(absl::Duration, peer_timeout, absl::Seconds(3),
          "A peer silent this long is down, and a move stalled this long fails UNAVAILABLE.");
ABSL_FLAG(absl::Duration, forward_timeout, absl::Seconds(10),
          "Longest a call forwarded to another node may take unless it waits for a transfer "
          "(Wait, Watch, a waiting Submit, Read and Write streams end when that node is seen "
          "down instead).");
ABSL_FLAG(std::string, ucx_net_devices, "auto",
          "UCX_NET_DEVICES for the UCX engine: the network devices it listens and connects on "
          "(\"auto\": lo when every --listen address is loopback or a unix socket, else "
          "every device; the environment's UCX_NET_DEVICES wins).");
ABSL_FLAG(bool, ucx, true, "Start the UCX engine for node-to-node moves.");
ABSL_FLAG(gpumove::ByteSize, ucx_chunk, gpumove::ByteSize{4 << 20},
          "Bytes per UCX put/get; eight are kept in flight per move.");
ABSL_FLAG(gpumove::ByteSize, ucx_device_chunk, gpumove::ByteSize{256 << 20},
          "Bytes per UCX put/get when device memory is on either side (a CUDA-aware UCX "
          "moves it directly): each is one GPU copy or one rendezvous UCX pipelines itself.");
ABSL_FLAG(bool, ucx_shared_pools, true,
          "Host pools in memory UCX allocates (System V or POSIX shared memory), so that UCX "
          "moves with daemons on this host are one memcpy; off: private memory, which UCX "
          "reaches across processes with cma.");
ABSL_FLAG(bool, ucx_direct, true,
          "Moves with peer pools UCX reaches through shared memory (daemons on this host) are "
          "copies by the moving thread through UCX's mapping (ucp_rkey_ptr), not puts and gets "
          "through the progress thread.");
ABSL_FLAG(bool, ucx_peer_calls, true,
          "The moving side's calls to other nodes (holds, acknowledgements, staging and MPI "
          "steps) as UCX active messages where both nodes have UCX; off: over gRPC.");
ABSL_FLAG(absl::Duration, ucx_poll, absl::Milliseconds(1),
          "After activity UCX's progress thread keeps polling this long before it sleeps, and "
          "a peer call waits this long for its answer before blocking: answers then need no "
          "thread wake-up. 0: always sleep.");
ABSL_FLAG(int, direct_copy_threads, 0,
          "Threads one direct copy with a same-host peer is split over; 0: a quarter of the "
          "CPUs, at most 8.");
ABSL_FLAG(int, piece_copy_threads, 0,
          "Threads a vectored move's piece copies with a same-host peer are split over; 0: the "
          "CPUs, at most 8 (as LOCAL's host piece copies); never fewer than "
          "--direct_copy_threads.");
ABSL_FLAG(int, staged_copy_threads, 0,
          "Threads one such copy in a staged move (into or out of bounce slots, beside the "
          "move's GPU copies) is split over; 0: half of --direct_copy_threads for the wire step "
          "between two nodes' bounce slots, a quarter for a push from ours into another "
          "node's memory, at least 1.");
ABSL_FLAG(int, ucx_lanes, 0,
          "UCX lanes, each with its own context, worker, connections and progress thread: "
          "a host move over the network (not a same-host direct copy) is split over the "
          "lanes both nodes have, smaller ones take turns. 0: one per 8 CPUs, 1 to 4.");
ABSL_FLAG(std::string, ucx_rails, "",
          "RDMA devices to bind UCX lanes to, one a lane (\"mlx5_0:1,mlx5_1:1\"; \"auto\": every "
          "active RDMA port when there are two or more; empty: lanes per --ucx_lanes). A host "
          "move over the network is split over the rails; a rail that fails under a move has "
          "its share sent again on the others and is left out of moves to that peer until "
          "it works again (probed after 1 s, doubling to 60 s). Both nodes should name their "
          "rails in the same order: lane i pairs with the peer's lane i.");
ABSL_FLAG(absl::Duration, peer_call_poll, absl::Milliseconds(-1),
          "After serving a peer call, a serving thread polls this long for the next one "
          "before it sleeps. Negative: --ucx_poll with 16 CPUs or more, a fifth of it below.");
ABSL_FLAG(absl::Duration, peer_call_awake, absl::Milliseconds(-1),
          "While a peer call made or served here is unanswered, the UCX progress thread and "
          "the caller poll up to this long after the last activity instead of sleeping (an "
          "acknowledgement waiting for a long copy's end). Negative: 10ms with 16 CPUs or "
          "more, 0 below.");
ABSL_FLAG(absl::Duration, pool_spin, absl::Milliseconds(-1),
          "An idle thread of the copy and staging pools looks for its next job this long "
          "before it sleeps (a staged move hands each piece to pool threads several times). "
          "Negative: 1ms with 16 CPUs or more, 0 below.");
ABSL_FLAG(gpumove::ByteSize, ucx_lane_share, gpumove::ByteSize{512 << 10},
          "Smallest share of a move split over UCX lanes.");
ABSL_FLAG(bool, cuda_ipc_fences, true,
          "Offer peers that copy into or out of this node's GPU memory over CUDA IPC (moves of "
          "their --cuda_ipc_fence_min or more) to end with the copy still running behind an "
          "interprocess event, so the acknowledgement's round trip overlaps the copy; this "
          "node holds the range until it sees the event pass.");
ABSL_FLAG(gpumove::ByteSize, cuda_ipc_fence_min, gpumove::ByteSize{4ull << 20},
          "Smallest CUDA IPC move this node runs that ends with its copy still running behind "
          "a fence (when the other node offers --cuda_ipc_fences); smaller ones copy to the "
          "end before the other node is told.");
ABSL_FLAG(gpumove::ByteSize, cuda_ipc_fence_quiet, gpumove::ByteSize{1000ull * 1000 * 1000 * 1000},
          "Bytes per second no CUDA IPC copy into or out of this node's GPUs beats: a fence "
          "of L bytes is not queried before L / this after its acknowledgement came (0: at "
          "once).");
ABSL_FLAG(std::string, file_roots, "",
          "Directories under which clients may register files as buffers (BufferService."
          "RegisterFile), comma-separated absolute paths, each optionally ending :ro "
          "(registered read-only) or :rw (the default). Paths resolve beneath their root only "
          "(no \"..\", no symbolic links, regular files with one link). Empty: no file buffers.");
ABSL_FLAG(int, file_io_queue_depth, 16,
          "Reads or writes in flight per FILE_IO move through io_uring (1 to 256).");
ABSL_FLAG(gpumove::ByteSize, file_io_chunk, gpumove::ByteSize{1ull << 20},
          "Bytes per read or write of a FILE_IO move (a multiple of 4 KiB).");
ABSL_FLAG(bool, file_io_fallback, false,
          "Move FILE_IO bytes with pread/pwrite on the move's thread even where io_uring "
          "works (it is used automatically where io_uring is refused).");
ABSL_FLAG(std::string, ucx_require, "",
          "The class of UCX transport moves to peers on other hosts must run over: rdma "
          "(InfiniBand/RoCE verbs), tcp, or empty for any. A move UCX would carry over "
          "anything else fails FAILED_PRECONDITION naming what UCX chose, instead of running "
          "slow (fallbacks are counted in gpumove_ucx_fallback_moves_total either way).");
ABSL_FLAG(bool, ucx_force_staging, false,
          "Stage every range peers move to or from this node through pinned bounce buffers, "
          "as device memory is without a CUDA-aware UCX (to test that path without a GPU).");
ABSL_FLAG(gpumove::ByteSize, stage_chunk, gpumove::ByteSize{8 << 20},
          "Bytes per pinned bounce buffer of a staged UCX move (smaller for moves of fewer "
          "bytes than --stage_slots of them).");
ABSL_FLAG(int, stage_slots, 4, "Pinned bounce buffers per staged UCX move and side.");
ABSL_FLAG(std::string, mpi, "auto",
          "MPI path: auto (when started by mpirun/mpiexec/srun), on (fail without MPI) or off. "
          "As a rank the node is named rank<N> (or --node with %r for the rank), the other "
          "ranks are its peers, and without --listen it serves 127.0.0.1:(7470 + its rank "
          "on this host).");
ABSL_FLAG(absl::Duration, mpi_poll, absl::Milliseconds(2),
          "The MPI thread polls MPI this long after a completion or a new operation before it "
          "naps: MPI moves bytes only while polled.");
ABSL_FLAG(std::string, mpi_spin, "auto",
          "on: the MPI thread polls through --mpi_poll even with nothing posted, and a thread "
          "waiting for an MPI operation polls 50 microseconds before it blocks (small moves "
          "wake no thread); off: they block; auto: on with 16 CPUs or more.");
ABSL_FLAG(gpumove::ByteSize, mpi_chunk, gpumove::ByteSize{4 << 20},
          "Bytes per MPI message of a move; four are kept in flight per move.");
ABSL_FLAG(gpumove::ByteSize, mpi_device_chunk, gpumove::ByteSize{64 << 20},
          "Bytes per MPI message of a move whose side on this node is device memory a "
          "CUDA-aware MPI takes directly.");
ABSL_FLAG(std::string, mpi_datatypes, "auto",
          "Vectored MPI messages as MPI derived datatypes (MPI packs the pieces) instead of "
          "packed by copy threads or the gather kernel: always (host memory, and device "
          "memory with a CUDA-aware MPI), never, or auto (host memory, when every rank of the "
          "job is on this host).");
ABSL_FLAG(bool, mpi_force_staging, false,
          "Stage this node's side of every MPI move through pinned bounce buffers, as device "
          "memory is with a host-only MPI (to test that path without a GPU).");
ABSL_FLAG(std::string, metrics_listen, "",
          "Serve Prometheus metrics at http://HOST:PORT/metrics (port 0 picks one; a port alone "
          "is 127.0.0.1, name a host to serve beyond this one); empty: off.");
ABSL_FLAG(std::string, tls_cert, "",
          "TLS on the TCP --listen addresses: PEM file of this daemon's certificate chain "
          "(re-read when it changes; a new pair that does not check out is refused and the "
          "old one kept).");
ABSL_FLAG(std::string, tls_key, "", "TLS: PEM file of the certificate's private key.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "mTLS: PEM file of the CAs that sign client certificates; clients without one "
          "are refused.");
ABSL_FLAG(absl::Duration, tls_refresh, absl::Seconds(1),
          "How often the TLS files are looked at for a change.");
ABSL_FLAG(std::string, peer_tls_ca, "",
          "Peers over TLS: PEM file of the CAs that sign peers' certificates (default: "
          "--tls_client_ca, with this daemon's own --tls_cert/--tls_key presented to them).");
ABSL_FLAG(std::string, peer_tls_cert, "",
          "Peers over TLS: PEM certificate presented to peers that require one.");
ABSL_FLAG(std::string, peer_tls_key, "", "Peers over TLS: the key of --peer_tls_cert.");
ABSL_FLAG(std::string, peer_tls_server_name, "",
          "Peers over TLS: the name every peer's certificate carries, checked instead of the "
          "host of the address dialled (one certificate for nodes reached by IP, e.g. "
          "Kubernetes pods: the headless Service's name).");
ABSL_FLAG(std::string, cluster_secret_file, "",
          "A file holding a secret every node of the cluster has (at least 16 bytes; e.g. "
          "openssl rand -hex 32 > FILE): every peer call, over gRPC or UCX, is authenticated "
          "with it (an HMAC, replays refused) and the UCX addresses, keys and IPC handles go "
          "only to holders. Needed for --peers when clients need credentials.");
ABSL_FLAG(std::string, cluster_secret_accept_file, "",
          "A second cluster secret taken from peers but not signed with, for rotating the "
          "secret without a restart: on every node accept the new one here, then make it "
          "--cluster_secret_file's (the old one here), then empty this file. Both files are "
          "re-read when they change.");
ABSL_FLAG(absl::Duration, peer_clock_skew, absl::Minutes(2),
          "With --cluster_secret_file: how far a peer call's clock may be from this node's.");
ABSL_FLAG(std::string, auth_tokens, "",
          "Bearer tokens callers must present (authorization: Bearer TOKEN): a file of "
          "token,principal,tenant,role lines (role admin, user or reader; # comments), re-read "
          "when it changes. Every node of a cluster reads the same file. Empty: open, every "
          "caller anonymous.");
ABSL_FLAG(std::string, client_cert_principals, "",
          "With --tls_client_ca: client certificates as callers, a file of "
          "identity,principal,tenant,role lines where identity is a subject alternative name "
          "(DNS, IP, URI, email) or the common name of the certificate (SANs first, in order); "
          "re-read when it changes. A call with a bearer token (--auth_tokens) is its token's.");
ABSL_FLAG(std::string, unix_socket_principals, "",
          "Callers on unix: --listen sockets known by their uid (SO_PEERCRED): a file of "
          "user,principal,tenant,role lines where user is a uid or a user name; re-read when "
          "it changes. A call with a bearer token is its token's; a uid not in the file is "
          "refused.");
ABSL_FLAG(std::string, quotas, "",
          "Per-tenant quotas on this node: a file of tenant,host,pinned,device,transfers lines "
          "(sizes like 4GiB, - for no limit; tenant * is every tenant not named; admins have "
          "none); past one, RESOURCE_EXHAUSTED. Re-read when it changes.");
ABSL_FLAG(std::string, tenant_weights, "",
          "Tenants' weights for fair shares of the bytes moves start within a priority class: "
          "a file of `tenant weight` lines (weight 1 to 1000; tenant * is every tenant not "
          "named; default 1). Re-read when it changes; a file with a bad line is refused, "
          "logged, and the weights before kept.");
ABSL_FLAG(absl::Duration, qos_starvation_bound, absl::Milliseconds(500),
          "A lower priority class whose oldest ready move has waited this long gets a turn "
          "(at most one pick in four) while higher classes have moves ready.");
ABSL_FLAG(gpumove::ByteSize, max_message_size, gpumove::ByteSize{64 << 20},
          "The largest message a call may send or receive (8MiB to 1GiB); past it the call "
          "is RESOURCE_EXHAUSTED.");
ABSL_FLAG(std::string, introspection, "auto",
          "gRPC server reflection (v1 and v1alpha, the public services only, to callers with "
          "credentials where they are needed) and channelz: auto (reflection; channelz only on "
          "an open daemon, since it answers callers without credentials and lists other "
          "clients' addresses), on (both), off (neither). Health is always served.");
ABSL_FLAG(bool, allow_insecure, false,
          "Listen on addresses beyond this host although callers need no credentials "
          "(neither --auth_tokens nor --tls_client_ca): anyone who reaches the port may use "
          "every buffer. Without it such a daemon refuses to start.");
ABSL_FLAG(absl::Duration, handshake_timeout, absl::Seconds(10),
          "A connection that has not finished its TLS and HTTP/2 handshakes this long after "
          "it was accepted is closed.");
ABSL_FLAG(absl::Duration, max_connection_idle, absl::Hours(1),
          "A client connection with no call this long is closed (gracefully; clients "
          "reconnect).");
ABSL_FLAG(absl::Duration, keepalive, absl::Minutes(2),
          "Pings on a client connection with no traffic this often, so that dead clients' "
          "connections end.");
ABSL_FLAG(int, grpc_completion_queues, 0, "Completion queues of the gRPC server (0: gRPC's 1).");
ABSL_FLAG(int, grpc_min_pollers, 0,
          "Threads per completion queue always waiting for calls (0: gRPC's 1).");
ABSL_FLAG(int, grpc_max_pollers, 0,
          "Most threads per completion queue kept waiting for calls; a thread that ends a call "
          "when this many wait exits (0: gRPC's 2).");
ABSL_FLAG(std::string, unix_socket_mode, "0660",
          "Mode of unix: --listen sockets (octal): who on this host may connect.");
ABSL_FLAG(std::string, unix_socket_group, "",
          "Group of unix: --listen sockets (default: the daemon's own).");
ABSL_FLAG(bool, log_json, false, "Log JSON lines instead of plain text.");
ABSL_FLAG(int, v, 0, "Verbose log level.");

namespace gpumove {
namespace {

// The memory the daemon owns: pools, GPUs, leases, exportable buffers.
void PoolsFromFlags(DaemonOptions& options) {
  options.node = absl::GetFlag(FLAGS_node);
  options.pools.host = absl::GetFlag(FLAGS_host_pool_size).bytes;
  options.pools.pinned = absl::GetFlag(FLAGS_pinned_pool_size).bytes;
  options.pools.device = absl::GetFlag(FLAGS_device_pool_size).bytes;
  options.gpus = absl::GetFlag(FLAGS_gpus);
  options.default_lease = absl::GetFlag(FLAGS_default_lease);
  options.exportable_bytes_per_gpu = absl::GetFlag(FLAGS_exportable_bytes_per_gpu).bytes;
  options.scrub_memory = absl::GetFlag(FLAGS_scrub_memory);
  options.pool_spin = absl::GetFlag(FLAGS_pool_spin);
}

// Where and how clients reach the daemon, and who they may be.
absl::Status ServeFromFlags(ServeOptions& serve, bool listen_given) {
  serve.listen = absl::GetFlag(FLAGS_listen);
  serve.listen_given = listen_given;
  if (serve.listen.empty()) return absl::InvalidArgumentError("--listen is empty");
  serve.port_file = absl::GetFlag(FLAGS_port_file);
  serve.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  serve.auth_tokens = absl::GetFlag(FLAGS_auth_tokens);
  serve.client_cert_principals = absl::GetFlag(FLAGS_client_cert_principals);
  serve.unix_socket_principals = absl::GetFlag(FLAGS_unix_socket_principals);
  serve.quotas = absl::GetFlag(FLAGS_quotas);
  serve.tenant_weights = absl::GetFlag(FLAGS_tenant_weights);
  serve.max_message_size = absl::GetFlag(FLAGS_max_message_size).bytes;
  serve.allow_insecure = absl::GetFlag(FLAGS_allow_insecure);
  serve.introspection = absl::GetFlag(FLAGS_introspection);
  serve.handshake_timeout = absl::GetFlag(FLAGS_handshake_timeout);
  serve.max_connection_idle = absl::GetFlag(FLAGS_max_connection_idle);
  serve.keepalive = absl::GetFlag(FLAGS_keepalive);
  serve.completion_queues = absl::GetFlag(FLAGS_grpc_completion_queues);
  serve.min_pollers = absl::GetFlag(FLAGS_grpc_min_pollers);
  serve.max_pollers = absl::GetFlag(FLAGS_grpc_max_pollers);
  {
    const std::string mode = absl::GetFlag(FLAGS_unix_socket_mode);
    char* end = nullptr;
    const unsigned long m = std::strtoul(mode.c_str(), &end, 8);
    if (mode.empty() || *end != '\0' || m > 0777) {
      return absl::InvalidArgumentError("--unix_socket_mode is an octal mode such as 0660");
    }
    serve.unix_socket_mode = static_cast<uint32_t>(m);
  }
  serve.unix_socket_group = absl::GetFlag(FLAGS_unix_socket_group);
  serve.tls.cert = absl::GetFlag(FLAGS_tls_cert);
  serve.tls.key = absl::GetFlag(FLAGS_tls_key);
  serve.tls.client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  serve.tls.refresh = std::max(absl::Seconds(1), absl::GetFlag(FLAGS_tls_refresh));
  return absl::OkStatus();
}

// How peers are dialled and their calls authenticated.
void PeerSecurityFromFlags(DaemonOptions& options) {
  options.peer_tls = {absl::GetFlag(FLAGS_peer_tls_ca), absl::GetFlag(FLAGS_peer_tls_cert),
                      absl::GetFlag(FLAGS_peer_tls_key), absl::GetFlag(FLAGS_peer_tls_server_name)};
  options.cluster_secret_file = absl::GetFlag(FLAGS_cluster_secret_file);
  options.cluster_secret_accept_file = absl::GetFlag(FLAGS_cluster_secret_accept_file);
  options.peer_clock_skew = absl::GetFlag(FLAGS_peer_clock_skew);
}

// The scheduler's threads and caps, and what one caller may keep open or prepared.
void LimitsFromFlags(DaemonOptions& options) {
  SchedulerOptions& scheduler = options.scheduler;
  scheduler.workers = std::max(1, absl::GetFlag(FLAGS_copy_threads));
  scheduler.latency_workers = std::clamp(absl::GetFlag(FLAGS_latency_copy_threads), 0, 64);
  scheduler.max_active = static_cast<size_t>(std::max(1, absl::GetFlag(FLAGS_max_active)));
  options.call_limits.total = std::max(1, absl::GetFlag(FLAGS_max_open_calls));
  options.call_limits.per_principal =
      std::max(1, absl::GetFlag(FLAGS_max_open_calls_per_principal));
  scheduler.max_pieces = static_cast<size_t>(std::max(1, absl::GetFlag(FLAGS_max_blocks_per_move)));
  scheduler.rate_limit = absl::GetFlag(FLAGS_max_move_rate).bytes;
  scheduler.qos.starvation_bound =
      std::max(absl::ZeroDuration(), absl::GetFlag(FLAGS_qos_starvation_bound));
  options.notification_log =
      static_cast<size_t>(std::max(1, absl::GetFlag(FLAGS_notification_log)));
  options.prepared.lists_per_owner =
      static_cast<size_t>(std::max(0, absl::GetFlag(FLAGS_max_prepared_lists)));
  options.prepared.pieces_per_owner =
      static_cast<uint64_t>(std::max<int64_t>(0, absl::GetFlag(FLAGS_max_prepared_pieces)));
  scheduler.inline_max_bytes = absl::GetFlag(FLAGS_inline_move_max).bytes;
}

// Membership: the peers, heartbeats and timeouts, and the address advertised.
void ClusterFromFlags(DaemonOptions& options) {
  ClusterOptions& cluster = options.cluster;
  cluster.peers = absl::GetFlag(FLAGS_peers);
  cluster.heartbeat = absl::GetFlag(FLAGS_heartbeat);
  cluster.peer_timeout = absl::GetFlag(FLAGS_peer_timeout);
  cluster.forward_timeout = absl::GetFlag(FLAGS_forward_timeout);
  options.advertise = absl::GetFlag(FLAGS_advertise);
}

// The UCX path: its transport, lanes, peer calls, and the staging of its moves.
void UcxFromFlags(DaemonOptions& options) {
  UcxPathOptions& ucx = options.ucx;
  ucx.enabled = absl::GetFlag(FLAGS_ucx);
  ucx.net_devices = absl::GetFlag(FLAGS_ucx_net_devices);
  ucx.shared_pools = absl::GetFlag(FLAGS_ucx_shared_pools);
  ucx.peer_calls = absl::GetFlag(FLAGS_ucx_peer_calls);
  ucx.peer_call_poll = absl::GetFlag(FLAGS_peer_call_poll);
  ucx.force_staging = absl::GetFlag(FLAGS_ucx_force_staging);
  ucx.require = absl::GetFlag(FLAGS_ucx_require);
  ucx.lanes = absl::GetFlag(FLAGS_ucx_lanes);
  ucx.rails = absl::GetFlag(FLAGS_ucx_rails);
  ucx.lane_share = absl::GetFlag(FLAGS_ucx_lane_share).bytes;
  ucx.transport.chunk = std::max<uint64_t>(4096, absl::GetFlag(FLAGS_ucx_chunk).bytes);
  ucx.transport.device_chunk =
      std::max<uint64_t>(4096, absl::GetFlag(FLAGS_ucx_device_chunk).bytes);
  ucx.transport.direct = absl::GetFlag(FLAGS_ucx_direct);
  ucx.transport.poll_window = absl::GetFlag(FLAGS_ucx_poll);
  ucx.transport.call_awake = absl::GetFlag(FLAGS_peer_call_awake);
  ucx.transport.direct_threads = absl::GetFlag(FLAGS_direct_copy_threads);
  ucx.transport.staged_threads = absl::GetFlag(FLAGS_staged_copy_threads);
  ucx.transport.piece_threads = absl::GetFlag(FLAGS_piece_copy_threads);
  options.staging.chunk = std::max<uint64_t>(4096, absl::GetFlag(FLAGS_stage_chunk).bytes);
  options.staging.slots = std::max(2, absl::GetFlag(FLAGS_stage_slots));
}

absl::Status CudaIpcFromFlags(CudaIpcPathOptions& cuda_ipc) {
  cuda_ipc.fences = absl::GetFlag(FLAGS_cuda_ipc_fences);
  cuda_ipc.fence_min = absl::GetFlag(FLAGS_cuda_ipc_fence_min).bytes;
  cuda_ipc.fence_quiet = absl::GetFlag(FLAGS_cuda_ipc_fence_quiet).bytes;
  // Below a copy's real speed the holding node would not look until after the copy ended
  // (or its deadline passed): a slip of the unit, refused.
  if (cuda_ipc.fence_quiet != 0 && cuda_ipc.fence_quiet < (1ull << 30)) {
    return absl::InvalidArgumentError(
        "--cuda_ipc_fence_quiet is bytes per second: 0, or 1GiB or more");
  }
  return absl::OkStatus();
}

absl::Status MpiFromFlags(MpiPathOptions& mpi) {
  mpi.mode = absl::GetFlag(FLAGS_mpi);
  if (mpi.mode != "auto" && mpi.mode != "on" && mpi.mode != "off") {
    return absl::InvalidArgumentError("--mpi must be auto, on or off");
  }
  mpi.transport.poll_window = absl::GetFlag(FLAGS_mpi_poll);
  const std::string mpi_spin = absl::GetFlag(FLAGS_mpi_spin);
  if (mpi_spin != "auto" && mpi_spin != "on" && mpi_spin != "off") {
    return absl::InvalidArgumentError("--mpi_spin must be auto, on or off");
  }
  if (mpi_spin != "auto") mpi.spin = mpi_spin == "on";
  mpi.engine.chunk = std::max<uint64_t>(4096, absl::GetFlag(FLAGS_mpi_chunk).bytes);
  mpi.engine.device_chunk = std::max<uint64_t>(
      4096, std::min<uint64_t>(absl::GetFlag(FLAGS_mpi_device_chunk).bytes, 1ull << 30));
  mpi.engine.force_staging = absl::GetFlag(FLAGS_mpi_force_staging);
  const std::string mpi_datatypes = absl::GetFlag(FLAGS_mpi_datatypes);
  using Datatypes = MpiEngineOptions::Datatypes;
  if (mpi_datatypes == "always") {
    mpi.engine.datatypes = Datatypes::kAlways;
  } else if (mpi_datatypes == "never") {
    mpi.engine.datatypes = Datatypes::kNever;
  } else if (mpi_datatypes != "auto") {
    return absl::InvalidArgumentError("--mpi_datatypes must be auto, always or never");
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<char*> FoldRepeatedListen(int argc, char** argv, std::string& folded) {
  std::vector<char*> out;
  std::vector<std::string> values;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--listen=", 0) == 0) {
      values.push_back(a.substr(9));
    } else if (a == "--listen" && i + 1 < argc) {
      values.push_back(argv[++i]);
    } else {
      out.push_back(argv[i]);
    }
  }
  if (!values.empty()) {
    folded = "--listen=" + absl::StrJoin(values, ",");
    out.push_back(folded.data());
  }
  return out;
}

absl::StatusOr<DaemonOptions> OptionsFromFlags(bool listen_given) {
  DaemonOptions options;
  PoolsFromFlags(options);
  if (absl::Status st = ServeFromFlags(options.serve, listen_given); !st.ok()) return st;
  PeerSecurityFromFlags(options);
  LimitsFromFlags(options);
  ClusterFromFlags(options);
  UcxFromFlags(options);
  if (absl::Status st = CudaIpcFromFlags(options.cuda_ipc); !st.ok()) return st;
  if (absl::Status st = MpiFromFlags(options.mpi); !st.ok()) return st;
  options.file.roots = absl::GetFlag(FLAGS_file_roots);
  const int depth = absl::GetFlag(FLAGS_file_io_queue_depth);
  if (depth < 1 || depth > 256) {
    return absl::InvalidArgumentError("--file_io_queue_depth must be 1 to 256");
  }
  options.file.engine.queue_depth = static_cast<unsigned>(depth);
  options.file.engine.chunk = absl::GetFlag(FLAGS_file_io_chunk).bytes;
  options.file.engine.force_fallback = absl::GetFlag(FLAGS_file_io_fallback);
  return options;
}

}  // namespace gpumove
