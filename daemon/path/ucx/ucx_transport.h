// UCX RMA between daemons: one UCP context and worker per daemon, driven by one progress
// thread that makes every UCX call. Pools are registered once; endpoints and remote keys
// are cached per peer incarnation and dropped when the peer restarts or goes down.
//
// This file and its .cc are the only place that includes UCX headers.
#ifndef GPUMOVE_DAEMON_PATH_UCX_TRANSPORT_H_
#define GPUMOVE_DAEMON_PATH_UCX_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "daemon/core/segments.h"
#include "daemon/path/ucx/ucx_route.h"

namespace gpumove {

// Where a remote range is: which peer (endpoint key and worker address) and where in it.
struct RemoteRange {
  std::string peer_key;        // node + incarnation: a new incarnation is a new peer.
  std::string worker_address;  // The peer's ucp worker address.
  std::string rkey;            // Packed remote key of the pool holding the range.
  uint64_t address = 0;
  // Ask UCX for peer-failure handling on the endpoint. UCX 1.13 then leaves out the
  // shared-memory transports (cma, sysv, posix), so it is for peers on other hosts; a peer
  // on this host is watched by heartbeats and the op timeout instead.
  bool peer_error_handling = true;
  // The range is a peer's bounce slot, which a GPU copy reads next (a push) or has written
  // (a pull, into our bounce slot or buffer): a direct copy to or from it uses streaming
  // stores from kBounceStreamingMin bytes, not only from kStreamingCopyMin.
  bool bounce = false;
  // Device memory on one side at least (a CUDA-aware UCX moves it): UcxOptions::device_chunk.
  bool device = false;
  // The copy is one step of a staging pipeline (a bounce slot on one side at least), run
  // beside GPU copies into and out of bounce slots: a direct copy takes
  // UcxOptions::staged_threads threads, not direct_threads.
  bool staged = false;
};

// A staged piece's wire copy into or out of a bounce slot streams from 1 MiB (not 8): the
// slot is read next by a GPU copy, not by this CPU.
inline constexpr uint64_t kBounceStreamingMin = 1 << 20;

// UCX_TLS when the operator gives none: every transport but UD (whose endpoint timeouts
// abort UCX 1.13; RC and TCP serve where it would).
inline constexpr char kDefaultUcxTransports[] = "^ud";

// A peer as the call channel sees it.
struct UcxPeer {
  std::string key;             // As RemoteRange::peer_key.
  std::string worker_address;  // Its ucp worker address.
  bool error_handling = true;  // As RemoteRange::peer_error_handling.
};

// Answers one call: invoked once, from any thread, with the outcome and the reply body.
using UcxReply = std::function<void(const absl::Status&, std::string)>;
// Serves a call; runs on the progress thread, so it must hand real work to another thread.
// `caller` is who the message CLAIMS to come from (its peer key and the worker address to
// answer): nothing has vouched for it. `reply` makes an endpoint to that address, so the
// handler calls it only for a caller it has authenticated and knows (a Hello'd peer whose
// address is the one claimed); a call it does not trust it drops without an answer.
using UcxCallHandler =
    std::function<void(const UcxPeer& caller, uint32_t method, std::string body, UcxReply reply)>;

// The longest peer key a call may carry ("node#incarnation": a node name is at most 128
// bytes, cluster.h's CheckDescriptor).
inline constexpr size_t kMaxUcxPeerKey = 160;

struct UcxOptions {
  // Bytes per ucp_put_nbx / ucp_get_nbx, and how many are in flight per move.
  uint64_t chunk = 4 << 20;
  int window = 8;
  // Bytes per put/get when either side is device memory (RemoteRange::device): a CUDA-
  // aware UCX moves each with one GPU copy (cuda_ipc) or a rendezvous it pipelines itself
  // (RDMA), so per-request costs, not the size, set the pace there (256 MiB: 0.46 -> 0.78
  // of ucx_perftest for a 64 MiB -> 256 MiB move on the H200, docs/benchmarks.md).
  uint64_t device_chunk = 256 << 20;
  // A move whose bytes make no progress for this long fails with UNAVAILABLE.
  absl::Duration op_timeout = absl::Seconds(10);
  // Moves to and from peer memory that UCX reaches through shared memory (ucp_rkey_ptr:
  // peers on this host, pools in shared memory) are copies on the caller's thread
  // instead of puts and gets through the progress thread.
  bool direct = true;
  // Threads one direct copy is split over (ParallelHostCopy); 1: the moving thread alone.
  int direct_threads = 1;
  // Threads one direct copy in a staging pipeline (RemoteRange::staged) is split over: it
  // runs beside the pipeline's GPU copies into and out of bounce slots and shares the
  // host's memory bandwidth with them. 0: half or a quarter of direct_threads, at least 1
  // (see DirectCopyThreads).
  int staged_threads = 0;
  // Threads a vectored move's piece copies with a same-host peer are split over (outside
  // a staging pipeline's own window copies, which keep DirectCopyThreads): small scattered
  // copies wait on memory latency more than on bandwidth and gain from more threads than
  // a whole range's copy (docs/performance/tuning.md). Below direct_threads:
  // direct_threads.
  int piece_threads = 0;
  // After activity the progress thread keeps polling this long before it sleeps, and a
  // caller waits this long for its reply before it blocks: a peer call's answer then
  // needs no thread wake-up on this side. Zero: always sleep (small machines, where
  // the polling thread would take the CPU from the ones doing the work).
  absl::Duration poll_window = absl::ZeroDuration();
  // While a peer call this node made or serves is unanswered, the progress thread goes on
  // polling up to this long after its last activity, and a caller waits for its reply
  // this long before it blocks: an acknowledgement that waits for a long copy's end (a
  // 1 GiB CUDA IPC copy takes 2.7 ms) then wakes no thread on either side. Zero: only
  // poll_window.
  absl::Duration call_awake = absl::ZeroDuration();
  // UCX_NET_DEVICES for this context (which network devices its transports listen and
  // connect on, e.g. "lo"); empty: UCX's own (every device), or the environment's.
  std::string net_devices;
  // net_devices wins over the environment's UCX_NET_DEVICES (a rail's lane: its one
  // device, whatever the process's UCX settings).
  bool net_devices_win = false;
  // Run first on the progress thread, where UCX registers, packs and maps memory: the
  // daemon makes its GPU's CUDA context current there (UCX's cuda_ipc transport finds no
  // device without one, and device memory then goes by its software emulation).
  std::function<void()> thread_setup;
};

// Threads a direct copy to or from `remote` is split over: one in a staging pipeline
// (RemoteRange::staged) or any other. A staged move's wire step with every thread takes
// memory bandwidth from the GPU copies on both sides, so unless staged_threads says
// otherwise the wire step between two nodes' bounce slots (RemoteRange::bounce) takes half
// of direct_threads and a push from our slots into another node's memory a quarter
// (docs/performance/tuning.md).
int DirectCopyThreads(const UcxOptions& options, const RemoteRange& remote);

class UcxTransport {
 public:
  // Settings UCX takes from the environment, set unless the environment has them (TCP
  // segment size; the transports, UCX_TLS=kDefaultUcxTransports: all but UD); transports
  // created later use them. It calls setenv: call it first thing in main, while the
  // process has one thread.
  static void SetProcessDefaults();
  // Whether UCX_TLS=`tls` lets UCX pick a UD transport.
  static bool MayUseUd(absl::string_view tls);
  // Whether this host has RDMA devices (/sys/class/infiniband), where UD could run.
  static bool HasRdmaDevices();
  // UCX_TLS=kDefaultUcxTransports when unset and `rdma_devices`; a warning when the
  // operator's list lets UD in there. (SetProcessDefaults calls it with HasRdmaDevices.)
  static void SetTransportDefault(bool rdma_devices);
  // UNAVAILABLE (with UCX's message) when UCX cannot start.
  static absl::StatusOr<std::unique_ptr<UcxTransport>> Create(UcxOptions options);
  ~UcxTransport();
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  const std::string& worker_address() const { return worker_address_; }
  // Whether this UCX build takes CUDA device memory.
  bool cuda_aware() const { return cuda_aware_; }
  // Names of the transports UCX may use (UCX_TLS), for node info.
  std::string transports() const;

  // Host memory that UCX allocates and registers itself (ucp_mem_map with
  // UCP_MEM_MAP_ALLOCATE; UCX_ALLOC_PRIO puts its System V and POSIX shared-memory
  // allocators first). A peer on this host attaches it when it unpacks the remote key, so
  // its puts and gets are one memcpy instead of a cross-process copy (cma). Pages are
  // faulted in before this returns. Freed by Free or when the transport is destroyed.
  absl::StatusOr<void*> Allocate(uint64_t length);
  void Free(void* base);
  // What backs memory from Allocate: "shared memory" when a peer on this host can attach
  // it, else "private memory" (UCX then found no shared-memory allocator).
  std::string allocation_kind() const;

  // Registers host memory for RMA (once, at start) and returns its packed remote key.
  // Memory from Allocate is registered already; this just packs its key.
  absl::StatusOr<std::string> Register(void* base, uint64_t length);

  // Copies local -> remote (Put) or remote -> local (Get), `length` bytes, in chunks.
  // `progress` is called on the caller's thread with bytes known done and returns false
  // to stop (the call then returns CANCELLED). A Put returns after a flush: the bytes are
  // in the peer's memory. UNAVAILABLE when the peer fails or stalls past op_timeout.
  absl::Status Put(const RemoteRange& remote, const void* local, uint64_t length,
                   const std::function<bool(uint64_t)>& progress);
  absl::Status Get(const RemoteRange& remote, void* local, uint64_t length,
                   const std::function<bool(uint64_t)>& progress);

  // Vectored: every piece of `pieces` (src offsets from `local` and dst offsets from
  // remote.address for a put; the reverse for a get), one put or get per piece posted
  // back to back, then one flush; progress between slices of pieces.
  absl::Status PutPieces(const RemoteRange& remote, const void* local, const Segments& pieces,
                         const std::function<bool(uint64_t)>& progress);
  absl::Status GetPieces(const RemoteRange& remote, void* local, const Segments& pieces,
                         const std::function<bool(uint64_t)>& progress);

  // Whether moves with `remote` are direct copies (see UcxOptions::direct) rather than
  // puts and gets over the wire. Attaches the peer's pool the first time, as a move would.
  bool Direct(const RemoteRange& remote);

  // What UCX chose to reach `remote`'s peer (making its endpoint, as a move would, the
  // first time; kept until Forget): the lanes' transports and devices. UNAVAILABLE when
  // the peer cannot be reached.
  absl::StatusOr<UcxRoute> Route(const RemoteRange& remote);

  // Bytes moved by direct copies (see UcxOptions::direct) since start.
  uint64_t direct_bytes() const;
  // Times the progress thread went to sleep since start.
  uint64_t naps() const;

  // Calls between daemons: a request and its reply as UCX active messages over the same
  // endpoints as the moves (shared memory on one host, the network otherwise), so a peer
  // call costs UCX's latency plus two thread hand-offs instead of a gRPC round trip.
  // `self_key` is this daemon's peer key (callers' replies come back to it); `handler`
  // serves the calls that arrive; null stops serving (calls are then dropped unanswered:
  // nothing is ever sent to a caller no handler vouched for).
  void ServeCalls(const std::string& self_key, UcxCallHandler handler);
  // Call messages dropped by the transport itself since start (malformed, oversized, or
  // arriving while nothing serves), and replies it refused to send (a worker address that
  // does not parse as one of UCX's).
  uint64_t calls_dropped() const;
  // Sends `body` to `peer`'s handler for `method` and waits for the reply body.
  // UNAVAILABLE when the peer cannot be reached, fails or is forgotten meanwhile, or does
  // not answer within `timeout`; otherwise the handler's status.
  absl::StatusOr<std::string> Call(const UcxPeer& peer, uint32_t method, std::string body,
                                   absl::Duration timeout);

  // Drops the endpoint and remote keys of a peer incarnation; its moves and calls in
  // flight fail.
  void Forget(const std::string& peer_key);
  // How often `peer_key` was forgotten (a peer seen down or restarted): a move that saw it
  // change did not fail for one lane's sake.
  uint64_t Generation(const std::string& peer_key) const;
  // Whether this transport has a working endpoint to `peer_key` now (made, not failed).
  bool Connected(const std::string& peer_key) const;

 private:
  struct Impl;
  explicit UcxTransport(std::unique_ptr<Impl> impl);
  absl::Status Rma(bool put, const RemoteRange& remote, void* local, uint64_t length,
                   const std::function<bool(uint64_t)>& progress);
  absl::Status RmaPieces(bool put, const RemoteRange& remote, char* local, const Segments& pieces,
                         const std::function<bool(uint64_t)>& progress);
  absl::Status CopyDirect(bool put, const RemoteRange& remote, char* mapped, char* local,
                          uint64_t length, const std::function<bool(uint64_t)>& progress);

  std::unique_ptr<Impl> impl_;
  std::string worker_address_;
  bool cuda_aware_ = false;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_UCX_TRANSPORT_H_
