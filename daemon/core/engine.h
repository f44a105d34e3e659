// What the scheduler needs from a data-movement engine (a path): whether it can serve a
// pair of memories, and a blocking Move that reports progress and honours cancel.
#ifndef GPUMOVE_DAEMON_CORE_ENGINE_H_
#define GPUMOVE_DAEMON_CORE_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/core/file_region.h"
#include "daemon/core/segments.h"
#include "daemon/memory/pool.h"

namespace gpumove {

enum class PathKind { kAuto, kLocal, kCudaIpc, kUcx, kMpi, kFile };

const char* PathKindName(PathKind path);

// One run of a node: its name and incarnation (a node that restarts is a new peer).
struct PeerId {
  std::string node;
  uint64_t incarnation = 0;
  // "node#incarnation": what transports cache a peer's endpoints and mappings under.
  std::string Key() const { return absl::StrCat(node, "#", incarnation); }
  bool operator==(const PeerId&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const PeerId& p) {
    return H::combine(std::move(h), p.node, p.incarnation);
  }
};

// What one path needs to reach a range held on another node (a UCX rkey, a CUDA IPC
// handle, bounce slots): made from the holder's answer by that path's codec and read by
// that path's engine only. The scheduler and the cluster pass it along unread.
class PathOffer {
 public:
  virtual ~PathOffer() = default;
};

// What a path asks of the holder with a hold (path MPI: start the receiving half then),
// written into the hold request by that path's codec.
class PathAsk {
 public:
  virtual ~PathAsk() = default;
};

// A range on another node, checked and held in use there for one transfer (see
// RemoteRanges): what every path knows of it, and each path's offer.
struct RemoteHold {
  std::string node;
  uint64_t incarnation = 0;
  PeerId peer() const { return {node, incarnation}; }
  std::string transfer_id;
  uint64_t address = 0;  // In the remote node's address space.
  uint64_t length = 0;
  MemoryKind kind = MemoryKind::kHost;
  int device = kHostDevice;
  bool write = false;      // The remote range is the destination.
  bool same_host = false;  // The remote node runs on this machine.
  // The remote node's holder reads the tail a move may end with (MoveTail::token, sent in
  // the acknowledgement) and sees it land itself before it ends its hold.
  bool reads_tails = false;
  // A checksummed push: the source's xxh3, sent with the acknowledgement so that the
  // remote node publishes the move's notification only over the same bytes.
  std::optional<uint64_t> source_xxh3;
  // One per path that can reach the range (none of a kind: that path cannot).
  std::vector<std::shared_ptr<const PathOffer>> offers;
  // The offer of type T (a path's own), or null.
  template <class T>
  const T* offer() const {
    for (const auto& o : offers) {
      if (const T* t = dynamic_cast<const T*>(o.get())) return t;
    }
    return nullptr;
  }
};

// One side of a move, already checked and held in use: local memory (data), a range
// on another node (remote), or a region of a file on this node (kind kFile: file, and
// file_offset, where the range starts in the file; data is null).
struct Endpoint {
  char* data = nullptr;
  MemoryKind kind = MemoryKind::kHost;
  int device = kHostDevice;
  const RemoteHold* remote = nullptr;
  const FileRegion* file = nullptr;
  uint64_t file_offset = 0;
};

// One range to hold on another node for one move (RemoteRanges::PrepareMany).
struct RemoteAsk {
  std::string transfer_id;
  std::string buffer_id;
  uint64_t offset = 0;
  uint64_t length = 0;
  bool write = false;
  PathKind path = PathKind::kAuto;
  bool local_device = false;
  // What the move's path asks of the holder with the hold (Engine::PrepareAsk); null: nothing.
  std::shared_ptr<const PathAsk> path_ask;
  // A destination's notify bytes, published by its node when the hold ends with the bytes in.
  std::optional<std::string> notify;
  // A checksummed vectored move's pieces (relative to the held ranges): the remote node
  // hashes its side of them (dst when `write`, else src) instead of the whole range.
  std::shared_ptr<const Segments> pieces;
  // A vectored move (its pieces travel with the hold only when checksummed, above), and
  // how many pieces it has.
  bool vectored = false;
  size_t piece_count = 0;
  // Its list's Segments.serial (nonzero for a list kept for many moves).
  uint64_t list_serial = 0;
};

// The last bytes of a move still landing when Engine::Move returned (a copy its path left
// running, e.g. on a GPU): this node waits for them before the move is done, and the
// other node may see them land itself from token(), which only the path that made it
// (and that path's holder on the other node) reads. MoveControl::KeepRunning takes it.
class MoveTail {
 public:
  // Waits for the bytes first.
  virtual ~MoveTail() = default;
  // What the other node's holder needs to see the bytes land (opaque here); empty when
  // they already have (nothing to wait for).
  virtual const std::string& token() const = 0;
  // Returns once every byte has landed; an error says why they did not.
  virtual absl::Status Wait() = 0;
  // Bytes still to land when the tail was made (at most; 0: not known).
  virtual uint64_t pending_bytes() const { return 0; }
};

// A move's tail as its acknowledgement carries it to the node holding the other end
// (CompleteRemoteRequest.tail_token): opaque but to the path's TailReader there.
struct AckTail {
  std::string token;   // Empty: no tail.
  uint64_t bytes = 0;  // MoveTail::pending_bytes.
  // The runner sees its tail land itself before it reports the move done: the other node
  // may acknowledge at once (without checksum) and end its hold when it sees the tail
  // land (CompleteRemoteRequest.runner_waits_tail).
  bool runner_waits = false;
};

// How the scheduler reaches ranges on other nodes; the cluster layer implements it.
class RemoteRanges {
 public:
  // The other node's acknowledgement of a move (see Complete).
  using AckCallback = std::function<void(absl::StatusOr<uint64_t>)>;

  virtual ~RemoteRanges() = default;
  // Checks and holds `range` on its node for transfer `transfer_id`. NOT_FOUND (unknown
  // node or buffer), UNAVAILABLE (node down), INVALID_ARGUMENT (bad range). `path` (the
  // move's requested path) and `local_device` (whether our end is device memory) let the
  // remote node skip setting up staging the move will not use.
  virtual absl::StatusOr<RemoteHold> Prepare(const std::string& owner,
                                             const std::string& transfer_id,
                                             const std::string& node, const std::string& buffer_id,
                                             uint64_t offset, uint64_t length, bool write,
                                             PathKind path = PathKind::kAuto,
                                             bool local_device = false) = 0;
  // Prepare for many moves' ranges on one node, in one round trip where the node allows;
  // one result per ask, in order.
  virtual std::vector<absl::StatusOr<RemoteHold>> PrepareMany(const std::string& owner,
                                                              const std::string& node,
                                                              const std::vector<RemoteAsk>& asks) {
    std::vector<absl::StatusOr<RemoteHold>> out;
    for (const RemoteAsk& a : asks) {
      out.push_back(Prepare(owner, a.transfer_id, node, a.buffer_id, a.offset, a.length, a.write,
                            a.path, a.local_device));
    }
    return out;
  }
  // Ends a hold after the move with its outcome; for an OK outcome the remote side
  // acknowledges the bytes (and returns the range's xxh3 when `checksum`). UNAVAILABLE
  // when the node cannot be reached.
  virtual absl::StatusOr<uint64_t> Complete(const RemoteHold& hold, const absl::Status& outcome,
                                            bool checksum, const AckTail& tail) = 0;
  // Complete without making the caller wait for the round trip when others to the same
  // node are in flight: `done` runs exactly once, on this thread before the call returns
  // or later on another thread (acknowledgements that pile up travel together).
  // `tail`: the move's last bytes still landing, which the remote node sees land before
  // its hold ends (empty token: none; only for holds that say reads_tails). `caller_busy`: the caller has more moves waiting,
  // so the acknowledgement should not be sent on its thread.
  virtual void CompleteAsync(const RemoteHold& hold, const absl::Status& outcome, bool checksum,
                             const AckTail& tail, bool caller_busy, AckCallback done) {
    done(Complete(hold, outcome, checksum, tail));
  }
  // Ends a hold without waiting (a move that never ran); best effort.
  virtual void Release(const RemoteHold& hold) = 0;
};

// This node's half of a two-sided move that another node runs (path MPI): started when
// the runner asks, ended with the hold.
class PassiveHalf {
 public:
  // Stops it (a sender stops after the chunks in flight) and waits for it.
  virtual ~PassiveHalf() = default;
  // A sender stops after the chunks in flight and tells the receiver so.
  virtual void Stop() = 0;
  // How it ended; DEADLINE_EXCEEDED if it has not by `deadline`.
  virtual absl::Status Wait(absl::Time deadline) = 0;
};

// Given to Move by the scheduler.
class MoveControl {
 public:
  virtual ~MoveControl() = default;
  // True once Cancel was asked for: stop at the next chunk boundary.
  virtual bool cancelled() const = 0;
  // Bytes known to have landed in the destination so far. May block briefly to hold the
  // daemon's rate limit.
  virtual void Progress(uint64_t bytes_done) = 0;
  // Progress(bytes_done), then whether to go on: the callback copy loops take.
  std::function<bool(uint64_t)> Reporter() {
    return [this](uint64_t bytes_done) {
      Progress(bytes_done);
      return !cancelled();
    };
  }
  // Whether the move may end with its last bytes still landing (a MoveTail) that the other
  // node sees land before it ends its hold (the scheduler's controls, for moves with a
  // remote end whose holder reads tails). Move then returns OK after handing the tail to
  // KeepRunning; the move is SUCCEEDED once the other node acknowledged and this one saw
  // the tail land.
  virtual bool AcceptsTail() const { return false; }
  virtual void KeepRunning(std::unique_ptr<MoveTail> tail) {}
  // What carries the move's bytes, as its path names it (UCX: the transports and devices
  // UCX chose, "rc_verbs/rxe0:1"); shown with the transfer and counted in its metrics.
  virtual void Carried(std::string what) {}
  // Bytes per second the move is held to by Progress (0: no cap). An engine whose chunks
  // would be too coarse to pace takes smaller ones under a cap.
  virtual uint64_t rate_limit() const { return 0; }
  // A move into a file that must be on stable storage (fdatasync) before it ends.
  virtual bool durable() const { return false; }
  // The class of transport ("rdma", "tcp") the move must run over when its ends are on
  // different hosts (TransferSpec.require_transport); empty: any. An engine that cannot
  // say what carries it refuses such a move between hosts (FAILED_PRECONDITION).
  virtual const std::string& required_transport() const {
    static const std::string kAny;
    return kAny;
  }
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual PathKind path() const = 0;
  // OK when Move can copy from `src` to `dst`; otherwise FAILED_PRECONDITION saying why.
  virtual absl::Status CanServe(const Endpoint& src, const Endpoint& dst) const = 0;
  // Whether it moves bytes of FILE buffers (kind kFile); the others are never asked to.
  virtual bool ServesFiles() const { return false; }
  // True when this engine would stage device memory of this move through host bounce
  // buffers (AUTO prefers an engine that does not).
  virtual bool Stages(const Endpoint& src, const Endpoint& dst) const { return false; }
  // For a move that asked for this path: may add to the hold request for its remote end
  // what lets the other node start its half with the hold (saving a round trip).
  virtual void PrepareAsk(RemoteAsk& ask) {}
  // The move on `hold` will not run (refused, cancelled before it began): undo what
  // PrepareAsk had the other node start. Called before the hold is released.
  virtual void Abandon(const RemoteHold& hold) {}
  // Copies `length` bytes and returns when they are visible in dst. CANCELLED when it
  // stopped early because control.cancelled().
  virtual absl::Status Move(const Endpoint& src, const Endpoint& dst, uint64_t length,
                            MoveControl& control) = 0;

  // Vectored moves. Whether MovePieces serves `src` and `dst` (after CanServe said yes).
  virtual bool MovesPieces(const Endpoint& src, const Endpoint& dst) const { return false; }
  // Copies every piece of `pieces` (offsets from src.data and dst.data, or from the
  // remote holds' addresses) and returns when all are visible in dst; progress in bytes
  // over all pieces, cancel between groups of pieces.
  virtual absl::Status MovePieces(const Endpoint& src, const Endpoint& dst, const Segments& pieces,
                                  MoveControl& control) {
    return absl::UnimplementedError("this path does not move the pieces of a vectored move");
  }
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_CORE_ENGINE_H_
