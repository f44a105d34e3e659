// Path UCX: moves between this node and another over UCX RMA. A push puts local bytes
// into the peer's registered pool and flushes; a pull gets them. Host and pinned memory
// go zero-copy from pool to pool. Local device memory goes direct with a CUDA-aware UCX,
// else through the staging pipeline (pinned bounce buffers, GPU copies overlapping the
// wire). Device memory on the remote side is staged by that side: the runner puts into or
// gets from its bounce slots and has it copy each chunk on or off its GPU.
#ifndef GPUMOVE_DAEMON_PATH_UCX_ENGINE_H_
#define GPUMOVE_DAEMON_PATH_UCX_ENGINE_H_

#include <atomic>
#include <map>
#include <string>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/core/engine.h"
#include "daemon/gpu/gpu.h"
#include "daemon/memory/pool.h"
#include "daemon/staging/staging.h"
#include "daemon/path/ucx/ucx_protocol.h"
#include "daemon/path/ucx/ucx_shares.h"
#include "daemon/path/ucx/ucx_transport.h"

namespace gpumove {

// Host pools in memory UCX allocates: shared with the daemons on this host, whose puts and
// gets into it become one memcpy.
class UcxHostMemory : public HostMemorySource {
 public:
  explicit UcxHostMemory(UcxTransport* transport) : transport_(transport) {}
  absl::StatusOr<void*> Allocate(uint64_t length) override { return transport_->Allocate(length); }
  void Free(void* base) override { transport_->Free(base); }

 private:
  UcxTransport* const transport_;
};

// Extra UCX lanes: transports of their own (context, worker, connections, progress
// thread) that carry host moves over the network beside the main one. One connection and
// one progress thread per side bound a TCP move by one thread's copies.
struct UcxLaneOptions {
  std::vector<UcxTransport*> lanes;  // Lane 1 first; lane 0 is the engine's transport.
  // A move is split into shares of at least this many bytes, run at once, one per lane
  // it takes (see UcxEngine::TakeLanes): a lone move uses every lane, many small ones
  // spread over them without splitting, big ones split over all.
  uint64_t min_share = 512 << 10;
  // The lanes are rails (one RDMA device each, --ucx_rails): a move's shares go over
  // lanes 1.. only, and lane 0 (the first transport, on every device) is their spare.
  bool rails = false;
};

// Which lanes a move takes, given how many moves use each lane now (`busy`, lane 0
// first), at most `most` (at least one): those no move uses, or when none is free the
// least used one; with `spread`, the least used ones whether free or not. Ties go to the
// lower lane.
std::vector<size_t> ChooseLanes(const std::vector<int>& busy, uint64_t most, bool spread);

// How one UCX move goes, from what its two ends are (ChooseUcxStrategy).
enum class UcxStrategy {
  // The other node stages its range: pieces through its bounce slots with a StageChunk
  // call each (and through ours when our end is device memory too).
  kRemoteStaged,
  // Our end is device memory and our UCX cannot take it: through our own bounce slots.
  kLocalStaged,
  // Host memory over the network: split into shares over the lanes both nodes have.
  kLanes,
  // One put or get: a direct copy with a peer on this host, device memory to a
  // CUDA-aware UCX, or no lanes to split over.
  kWhole,
};
const char* UcxStrategyName(UcxStrategy strategy);

// The strategy for a move whose remote end is staged by its node (`remote_staged`), whose
// local end is device memory our UCX cannot take (`local_staged`), with `lanes` extra
// lanes both nodes have for it, and `direct` when the peer's memory is mapped here (a
// direct copy is one memcpy: no lanes).
UcxStrategy ChooseUcxStrategy(bool remote_staged, bool local_staged, size_t lanes, bool direct);

class UcxEngine : public Engine {
 public:
  // All must outlive the engine; `pinned` (may be null: no staging) lends bounce buffers;
  // `remote` drives the other node's half of a move it stages.
  UcxEngine(UcxTransport* transport, GpuRuntime* gpu, Pool* pinned, ClusterRemoteRanges* remote,
            StagingOptions staging = {}, UcxLaneOptions lanes = {})
      : transport_(transport),
        gpu_(gpu),
        pinned_(pinned),
        remote_(remote),
        staging_(staging),
        lanes_(std::move(lanes)) {}

  PathKind path() const override { return PathKind::kUcx; }
  absl::Status CanServe(const Endpoint& src, const Endpoint& dst) const override;
  bool Stages(const Endpoint& src, const Endpoint& dst) const override {
    const Endpoint& local = src.remote != nullptr ? dst : src;
    const RemoteHold* remote = src.remote != nullptr ? src.remote : dst.remote;
    return (local.kind == MemoryKind::kDevice && !transport_->cuda_aware()) ||
           (remote != nullptr && remote->offer<UcxOffer>() != nullptr &&
            remote->offer<UcxOffer>()->stage.has_value());
  }
  absl::Status Move(const Endpoint& src, const Endpoint& dst, uint64_t length,
                    MoveControl& control) override;
  // Vectored moves of memory the other node's UCX reaches (host memory, or device memory
  // with a CUDA-aware UCX; not staged there): one put or get per piece, posted back to
  // back; our own device memory through our bounce slots when our UCX cannot take it.
  bool MovesPieces(const Endpoint& src, const Endpoint& dst) const override;
  absl::Status MovePieces(const Endpoint& src, const Endpoint& dst, const Segments& pieces,
                          MoveControl& control) override;

  // Bytes that extra lanes carried (shares and whole moves on lanes 1 and up).
  uint64_t lane_bytes() const { return lane_bytes_.load(); }
  // Failover inside moves: lanes that failed under a share (whose share another lane then
  // carried, or the move failed with none left), bytes sent again, and (peer, lane) pairs
  // down now.
  uint64_t lane_failovers() const { return lane_failovers_.load(); }
  uint64_t lane_resent_bytes() const { return lane_resent_bytes_.load(); }
  size_t lanes_down();

  // The class of transport (UcxTransportClass: "rdma", "tcp", ...) that moves to peers on
  // other hosts must run over: a move UCX would carry otherwise fails FAILED_PRECONDITION
  // naming what UCX chose (--ucx_require). Empty: any. Set before the first move.
  void set_require(std::string kind) { require_ = std::move(kind); }
  // Moves to peers on other hosts that ran without RDMA on a host that has RDMA devices
  // (a silent fallback, e.g. to TCP), and moves refused for --ucx_require.
  uint64_t fallbacks() const { return fallbacks_.load(); }
  uint64_t refused() const { return refused_.load(); }

 private:
  // A host move over the wire (not direct, not staged), split into one share per lane
  // of `use.use` (lane 0: the main transport), run at once; a share whose lane fails is
  // sent again on a spare lane or another of `use` (RunShares), and the failed lane is
  // left out of moves to that peer until a probe is due (LaneFailed).
  absl::Status MoveOverLanes(bool push, const RemoteRange& remote, const UcxOffer& offer,
                             char* local, uint64_t length, MoveControl& control,
                             const ShareLanes& use);
  // ChooseLanes among lanes 0 .. usable-1 that are up toward `peer_key` (or due for a
  // probe) for this node's moves; the others up are the spares. The lanes of `use` are
  // counted as in use until GiveBackLanes.
  ShareLanes TakeLanes(const std::string& peer_key, size_t usable, uint64_t most, bool spread);
  void GiveBackLanes(const std::vector<size_t>& lanes);
  // What a move's shares did to the lanes' health toward `peer_key`: a failed lane is
  // left out for a backoff (1 s, doubling to kLaneBackoffMost), after which one move
  // tries it again (a probe: its share fails over if the lane is still down); a lane
  // that carried a share is up again.
  void LaneOutcome(const std::string& peer_key, const SharesOutcome& out);
  static constexpr absl::Duration kLaneBackoffFirst = absl::Seconds(1);
  static constexpr absl::Duration kLaneBackoffMost = absl::Seconds(60);
  static constexpr size_t kMaxDownPeers = 1024;
  // Moves with at least this much per lane are spread over all lanes (only free lanes
  // piled big moves up on some lanes while others idled; docs/performance/tuning.md).
  static constexpr uint64_t kSpreadShare = 8 << 20;
  // Pieces on the wire at once in a move staged by the remote node (see MoveRemoteStaged).
  static constexpr int kWireThreads = 2;
  // Our device memory and a UCX that cannot take it: through our pinned bounce slots
  // (waiting for room while other moves use the pool). A vectored move (`pieces`) goes
  // through the same pipeline as its pieces' bytes one after another: a window of them
  // gathered into a slot by the GPU and put to their places piece by piece (a pull: got
  // piece by piece into a slot and scattered by the GPU).
  absl::Status MoveLocalStaged(bool push, const RemoteRange& remote, const Endpoint& src,
                               const Endpoint& dst, uint64_t length, MoveControl& control,
                               const std::function<bool(uint64_t)>& progress,
                               const Segments* pieces = nullptr);
  // The bounce slots of a move staged by the other node: its slots (taken now if the
  // hold left them for later) and, for our device memory with a UCX that cannot take it,
  // as many of ours of the same size.
  struct StageSides {
    std::vector<uint64_t> far;
    std::optional<BounceRing> ours;
  };
  absl::StatusOr<StageSides> TakeStageSides(const Endpoint& local, const RemoteHold& hold,
                                            const UcxOffer::Stage& offered, MoveControl& control);
  // A move whose remote end is staged by the remote node: pieces go through its bounce
  // slots, with a StageChunk call per piece (and through ours when ours is device memory).
  // A vectored move (`pieces`, `length` their total) goes through the same pipeline as
  // its pieces' bytes one after another; the peer's copy of a window is one gather or
  // scatter (StagePieces, at most kRoundPieces pieces a call).
  absl::Status MoveRemoteStaged(const Endpoint& src, const Endpoint& dst, const RemoteHold& hold,
                                const UcxOffer& offer, uint64_t length, MoveControl& control,
                                const std::function<bool(uint64_t)>& progress,
                                const Segments* pieces = nullptr);
  static constexpr size_t kRoundPieces = 16384;
  // Says what carries a move to `hold`'s node (MoveControl::Carried), counts a fallback,
  // and refuses the move when it would not run over the required class.
  absl::Status Carry(const RemoteHold& hold, const RemoteRange& remote, bool direct,
                     MoveControl& control);

  UcxTransport* const transport_;
  GpuRuntime* const gpu_;
  Pool* const pinned_;
  ClusterRemoteRanges* const remote_;
  const StagingOptions staging_;
  const UcxLaneOptions lanes_;
  absl::Mutex lane_mu_;
  std::vector<int> lane_busy_ ABSL_GUARDED_BY(lane_mu_);  // Moves on each lane.
  std::atomic<uint64_t> lane_bytes_{0};
  // Lanes that failed toward a peer (by peer key): when a move may try them again.
  struct LaneDown {
    absl::Time retry_at;
    absl::Duration backoff;
  };
  absl::flat_hash_map<std::string, std::map<size_t, LaneDown>> lanes_down_
      ABSL_GUARDED_BY(lane_mu_);
  std::atomic<uint64_t> lane_failovers_{0};
  std::atomic<uint64_t> lane_resent_bytes_{0};
  std::string require_;
  const bool rdma_here_ = UcxTransport::HasRdmaDevices();
  std::atomic<uint64_t> fallbacks_{0}, refused_{0};
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_UCX_ENGINE_H_
