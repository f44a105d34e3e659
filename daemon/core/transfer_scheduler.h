// The transfer scheduler: validates moves, orders those that touch the same bytes, runs
// them on engines with a pool of worker threads, and keeps their state for Get, List,
// Wait and Watch.
//
// Ordering: a transfer waits for every earlier, unfinished transfer whose destination
// overlaps its destination or its source, or whose source overlaps its destination
// (write-after-write, read-after-write, write-after-read). Others run concurrently.
#ifndef GPUMOVE_DAEMON_CORE_TRANSFER_SCHEDULER_H_
#define GPUMOVE_DAEMON_CORE_TRANSFER_SCHEDULER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/core/buffer_registry.h"
#include "daemon/core/engine.h"
#include "daemon/core/notifications.h"
#include "daemon/core/qos.h"
#include "daemon/core/range.h"
#include "daemon/core/range_order.h"
#include "daemon/core/segments.h"

namespace gpumove {

class HoldPlanner;
struct TransferRecord;

enum class TransferState { kQueued, kRunning, kSucceeded, kFailed, kCancelled };

const char* TransferStateName(TransferState state);
inline bool IsTerminal(TransferState s) { return s >= TransferState::kSucceeded; }

struct TransferSpec {
  RangeSpec source;
  RangeSpec destination;
  PathKind path = PathKind::kAuto;
  bool checksum = false;
  // Into a FILE buffer: on stable storage (fdatasync) before the move is SUCCEEDED.
  bool durable = false;
  std::string label;
  // Its class (qos.h): ready moves start latency first, then normal, then bulk.
  Priority priority = Priority::kNormal;
  // The transport class ("rdma", "tcp") it must run over between hosts; empty: any
  // (MoveControl::required_transport).
  std::string require_transport;
  // A vectored move: these pieces (offsets relative to source and destination; checked
  // with MakeSegments) instead of the whole range. The transfer then holds the smallest
  // ranges that contain its pieces, and its length is theirs in all; a destination
  // length 0 means to the end of the buffer.
  std::shared_ptr<const Segments> pieces;
  // Published by the destination's node once the bytes are visible there (notifications.h).
  std::optional<std::string> notify;
};

// A transfer as seen from outside, copied under the scheduler's lock.
struct TransferSnapshot {
  std::string id;
  RangeSpec source;  // Offsets and lengths resolved.
  RangeSpec destination;
  uint64_t length = 0;
  uint64_t pieces = 0;  // A vectored move's pieces (0: one contiguous range).
  PathKind path = PathKind::kAuto;
  bool durable = false;
  TransferState state = TransferState::kQueued;
  uint64_t bytes_done = 0;
  std::string owner;
  std::string node;
  std::string label;
  std::string idempotency_key;
  absl::Time create_time = absl::InfinitePast();
  absl::Time start_time = absl::InfinitePast();
  absl::Time end_time = absl::InfinitePast();
  absl::Status status;  // Why it FAILED (or CANCELLED).
  bool checksum = false;
  uint64_t source_xxh3 = 0;
  uint64_t destination_xxh3 = 0;
  uint64_t version = 0;           // Bumped on every state change.
  bool cancel_requested = false;  // Asked to stop; it stops at its next chunk.
  std::string carrier;            // What carried its bytes (MoveControl::Carried), if said.
  Priority priority = Priority::kNormal;
  // While QUEUED: earlier unfinished moves over overlapping bytes it waits for directly
  // (it runs after them whatever their classes); 0 once it only waits for a worker.
  int waits_for = 0;
};

// What the end of a transfer tells the daemon's counters (SchedulerOptions::on_end):
// nothing that allocates, since it is built under the scheduler's lock.
struct TransferEnd {
  PathKind path = PathKind::kAuto;
  TransferState state = TransferState::kQueued;
  uint64_t length = 0;
  absl::Time create_time = absl::InfinitePast();
  absl::Time start_time = absl::InfinitePast();
  absl::Time end_time = absl::InfinitePast();
  absl::string_view carrier;  // The record's, valid during on_end.
  absl::string_view owner;    // The record's (its tenant), valid during on_end.
  Priority priority = Priority::kNormal;
};

// xxh3-64 of `length` bytes at an endpoint (device memory included).
using RangeHasher = std::function<absl::StatusOr<uint64_t>(const Endpoint&, uint64_t)>;
// xxh3-64 of a vectored move's pieces at an endpoint, in list order: their source sides
// (`source`) or destination sides.
using PieceHasher =
    std::function<absl::StatusOr<uint64_t>(const Endpoint&, const Segments&, bool source)>;

struct SchedulerOptions {
  std::string node;
  int workers = 4;
  // Workers that run only latency-class moves, besides `workers`: a latency move finds
  // one free while every other worker runs a long bulk move (it waits at most for the
  // latency moves before it, never for a bulk move to end). 0: none.
  int latency_workers = 1;
  // Transfers queued or running at once; past it Submit is RESOURCE_EXHAUSTED.
  size_t max_active = 4096;
  // Finished transfers remembered for Get/List/idempotency, oldest forgotten first
  // (at least 1).
  size_t max_finished = 10000;
  // Moves in one Submit.
  size_t max_batch = 1024;
  // Per-move bandwidth cap in bytes/s; 0 means none.
  uint64_t rate_limit = 0;
  // A lone move with nothing to wait for, submitted by a caller that will wait for it
  // anyway, runs on the caller's thread (no hand-off to a worker and back) when it has at
  // most this many bytes, or when a worker is idle (it then takes that worker's place).
  // In a batch for a waiting caller, its moves of at most this many bytes with nothing to
  // wait for run on the caller's thread one after another, up to 1 MiB in all; the others
  // go to the workers meanwhile. 0 turns this off.
  uint64_t inline_max_bytes = 64 << 10;
  // Called (under the scheduler's lock: it must not call back) when a transfer ends.
  std::function<void(const TransferEnd&)> on_end;
  // Each owner's transfers queued or running at once, past which its Submit is
  // RESOURCE_EXHAUSTED (Quotas::TransferLimit); null: none. Must outlive the scheduler.
  const Quotas* quotas = nullptr;
  // Pieces of one vectored move (segments or blocks); past it RESOURCE_EXHAUSTED.
  size_t max_pieces = size_t{1} << 20;
  // Checksums of vectored moves; null: a vectored move with a checksum is refused.
  PieceHasher piece_hasher;
  // Called at the Submit of a vectored LOCAL or CUDA_IPC move with GPU memory at either
  // end and a list of its own (not a prepared one), on the Submit's thread, with the
  // pieces the move will copy (GpuRuntime::StagePieces); null: not called.
  std::function<void(const std::shared_ptr<const Segments>&)> stage_pieces;
  // Where moves into this node's buffers that carry notify bytes are published (those
  // into other nodes' buffers are published there); null: such moves are refused.
  NotificationLog* notifications = nullptr;
  // How ready moves are picked for the workers (qos.h): by class, then tenants' weights
  // from `weights` (null: all weigh 1; must outlive the scheduler).
  QosOptions qos;
  const TenantWeights* weights = nullptr;
};

class TransferScheduler {
 public:
  // `registry`, the engines and the hasher must outlive the scheduler. Engines are tried
  // in order for PATH_AUTO.
  TransferScheduler(SchedulerOptions options, BufferRegistry* registry,
                    std::vector<Engine*> engines, RangeHasher hasher,
                    RemoteRanges* remote = nullptr);
  ~TransferScheduler();
  TransferScheduler(const TransferScheduler&) = delete;
  TransferScheduler& operator=(const TransferScheduler&) = delete;

  // Accepts all of `specs` or none. With a non-empty idempotency key, a repeat from the
  // same owner returns the transfers of the first call. `caller_waits` says the caller
  // will Wait for the result, which lets a small move run inline (see inline_max_bytes);
  // the snapshots of moves run inline are taken at their end (the caller need not Wait
  // for those in an end state). `wait_bounded`: the caller waits only so long, so only
  // moves that end quickly whatever happens (small, no rate cap) run inline: one run
  // inline cannot be left at the caller's deadline.
  absl::StatusOr<std::vector<TransferSnapshot>> Submit(const std::string& owner,
                                                       const std::vector<TransferSpec>& specs,
                                                       const std::string& idempotency_key,
                                                       bool caller_waits = false,
                                                       bool wait_bounded = false);
  absl::StatusOr<TransferSnapshot> Get(const std::string& owner, const std::string& id) const;
  // Newest first; empty `states` means all.
  std::vector<TransferSnapshot> List(const std::string& owner,
                                     const std::vector<TransferState>& states, size_t limit) const;
  // Queued: ends it CANCELLED now. Running: asks the engine to stop at the next chunk.
  // Finished: changes nothing.
  absl::StatusOr<TransferSnapshot> Cancel(const std::string& owner, const std::string& id);
  // Blocks until the transfer ends or `deadline` (DEADLINE_EXCEEDED).
  absl::StatusOr<TransferSnapshot> Wait(const std::string& owner, const std::string& id,
                                        absl::Time deadline) const;
  // Blocks until the transfer's version differs from `seen_version`, it ends, the
  // scheduler stops, or `deadline`; returns the snapshot then (for Watch).
  absl::StatusOr<TransferSnapshot> WaitForChange(const std::string& owner, const std::string& id,
                                                 uint64_t seen_version, absl::Time deadline) const;
  // For waiters that hold no thread (the server's callback reactors): runs `changed` each
  // time transfer `id`'s version changes (its state, its end) and once when the scheduler
  // stops, under the scheduler's lock: it must not block or call the scheduler (it posts
  // a wake-up). Returns an id for ForgetChanges.
  uint64_t ListenForChanges(const std::string& id, std::function<void()> changed)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Once it returns, the listener of `listener` is neither called nor running.
  void ForgetChanges(uint64_t listener) ABSL_LOCKS_EXCLUDED(mu_);

  // Draining: Submit fails with UNAVAILABLE from now on.
  void StopAccepting();
  // Waits for every queued and running transfer to end, until `deadline`. True if all did.
  bool Drain(absl::Time deadline);
  // Cancels everything still queued or running.
  void CancelAll();
  size_t active() const;
  bool stopped() const;
  int workers() const { return options_.workers; }
  size_t max_pieces() const { return options_.max_pieces; }

 private:
  using Record = TransferRecord;  // transfer_record.h
  class Control;

  // Submitting (transfer_scheduler.cc).
  // The transfers of an earlier Submit with the same owner and idempotency key `idem`.
  std::optional<std::vector<TransferSnapshot>> ReplayLocked(const std::string& idem) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `count` more transfers of `owner` fit the queue and the owner's quota.
  absl::Status AdmitLocked(const std::string& owner, size_t count) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A waiting caller's small moves, run on its thread one after another; their ends are
  // recorded together, and `out` (the snapshots of `batch`) takes those that ended.
  void RunInline(const std::vector<std::shared_ptr<Record>>& run_inline,
                 const std::vector<std::shared_ptr<Record>>& batch,
                 std::vector<TransferSnapshot>& out) ABSL_LOCKS_EXCLUDED(mu_);

  // Running (transfer_runner.cc).
  // `latency_only`: a worker of SchedulerOptions::latency_workers.
  void WorkerLoop(bool latency_only);
  // A move run inline whose end is recorded with the others of its batch (one lock).
  struct Ended {
    std::shared_ptr<Record> t;
    absl::Status status;
    uint64_t src_hash = 0, dst_hash = 0;
  };
  // Runs a move. With `ended`, a move without a remote end leaves its end there for the
  // caller to record (RunInline) instead of taking the lock for it.
  void Run(const std::shared_ptr<Record>& t, std::vector<Ended>* ended = nullptr);
  // Whether moves are queued for a worker (the one running now has more to do after it).
  bool MovesWaiting() ABSL_LOCKS_EXCLUDED(mu_);
  // Lets go of the holds of moves that never ran (HoldPlanner::ReleaseUnrun, which may
  // wait for the other node, so never under mu_): FinishLocked leaves such holds in unrun_
  // for ReleaseUnrunHolds, which the callers of FinishLocked run once they have let go of
  // the lock.
  void ReleaseUnrunHolds() ABSL_LOCKS_EXCLUDED(mu_);
  // The end of a move once its bytes are in (acknowledged when remote): checksums, state.
  void AfterMove(const std::shared_ptr<Record>& t, absl::Status status, uint64_t src_hash,
                 uint64_t dst_hash, std::vector<Ended>* ended = nullptr);
  void FinishLocked(const std::shared_ptr<Record>& t, absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues `t` for a worker: it waits for nothing else now.
  void ReadyLocked(std::shared_ptr<Record> t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The transfer table (transfer_table.cc).
  std::vector<std::shared_ptr<Record>> UnfinishedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<Record> FindLocked(const std::string& owner, const std::string& id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  TransferSnapshot SnapshotLocked(const Record& t) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new version of `t` (every change of its state), told to its listeners.
  void ChangedLocked(Record& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The scheduler stops: every listener is told.
  void StopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SchedulerOptions options_;
  BufferRegistry* const registry_;
  const std::vector<Engine*> engines_;
  const RangeHasher hasher_;
  RemoteRanges* const remote_;
  // Checks moves and holds their ranges (hold_planner.h), outside mu_.
  const std::unique_ptr<HoldPlanner> planner_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Record>> transfers_ ABSL_GUARDED_BY(mu_);
  // The order of moves over the same bytes; the transfers in it that wait for others.
  RangeOrder order_ ABSL_GUARDED_BY(mu_);
  RangeOrder::Id orders_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<RangeOrder::Id, std::shared_ptr<Record>> waiting_ ABSL_GUARDED_BY(mu_);
  // Moves that wait for nothing but a worker, picked by class and tenant (qos.h).
  QosQueue<std::shared_ptr<Record>> ready_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> finished_ ABSL_GUARDED_BY(mu_);
  // owner + '\0' + key -> transfer ids, in request order.
  absl::flat_hash_map<std::string, std::vector<std::string>> idempotency_ ABSL_GUARDED_BY(mu_);
  size_t active_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, size_t> active_by_owner_ ABSL_GUARDED_BY(mu_);
  // Moves executing now, on workers or inline.
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int acking_ ABSL_GUARDED_BY(mu_) = 0;  // Acknowledgements not yet back.
  // Holds of transfers that ended before their move ran, to be let go outside the lock.
  std::vector<RemoteHold> unrun_ ABSL_GUARDED_BY(mu_);
  uint64_t sequence_ ABSL_GUARDED_BY(mu_) = 0;
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // ListenForChanges: listener id -> transfer id, and transfer id -> its listeners.
  absl::flat_hash_map<uint64_t, std::string> listener_ids_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::flat_hash_map<uint64_t, std::function<void()>>> listeners_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_listener_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<std::thread> workers_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_CORE_TRANSFER_SCHEDULER_H_
