// The receiving side of node-to-node moves: ranges of this node's buffers held in use for
// moves that other nodes run, from PrepareRemote until CompleteRemote, or until the
// runner is seen down or restarted.
#ifndef GPUMOVE_DAEMON_CLUSTER_HOLDS_H_
#define GPUMOVE_DAEMON_CLUSTER_HOLDS_H_

#include <atomic>
#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/core/buffer_registry.h"
#include "daemon/core/engine.h"
#include "daemon/gpu/gpu.h"
#include "daemon/path/staging.h"

namespace gpumove {

// When ranges on this node need staging (see HoldTable::Hold).
struct StagingPolicy {
  bool device = false;  // Device memory: the transport cannot take it.
  bool all = false;     // Every range (to exercise the protocol without a GPU).
  GpuRuntime* gpu = nullptr;  // Also waits for runners' CUDA IPC fences.
  Pool* pinned = nullptr;
  StagingOptions options;
  // The fastest a runner's CUDA IPC copy can land here, bytes per second: a fence with L
  // bytes behind it (as the runner says, at most the range) is not queried before L / this
  // after the acknowledgement came (the copy was queued before it was sent), so the
  // driver is left alone while the copy runs. 0: query at once.
  uint64_t fence_quiet_rate = 0;
};

class HoldTable {
 public:
  // `registry` and `hasher` (and the policy's gpu and pool) must outlive the table.
  HoldTable(BufferRegistry* registry,
            std::function<absl::StatusOr<uint64_t>(const Endpoint&, uint64_t)> hasher,
            StagingPolicy staging = {})
      : registry_(registry), hasher_(std::move(hasher)), staging_(staging) {}
  // Waits for the holds still ending (their fences pass or time out).
  ~HoldTable();
  HoldTable(const HoldTable&) = delete;
  HoldTable& operator=(const HoldTable&) = delete;

  // A bounce ring's slots (addresses in this process) and their size, as a peer is told.
  struct Slots {
    std::vector<char*> slots;
    uint64_t slot_size = 0;
  };
  // What a new hold is, copied out of the table: another call may end the hold as soon as
  // Hold returns, so nothing here points into it (the range's bytes stay the registry's).
  struct Held {
    char* data = nullptr;
    uint64_t length = 0;
    MemoryKind kind = MemoryKind::kHost;
    int device = kHostDevice;
    std::optional<Slots> ring;  // Set when this node stages the range.
    // Staged, but the pinned pool had no room for the ring now: TakeRing when the move
    // runs (its slots will be `stage_slot_size` bytes).
    bool stage_later = false;
    uint64_t stage_slot_size = 0;
  };
  // Checks and holds a range for (from_node, transfer_id), with a bounce ring when the
  // policy says it must be staged and `may_stage` (the move may use staging at all). A
  // pinned pool that is big enough but busy (other holds' rings) gives a hold without a
  // ring (stage_later); one too small for a ring gives RESOURCE_EXHAUSTED.
  // ALREADY_EXISTS for a repeat.
  absl::StatusOr<Held> Hold(const std::string& from_node, uint64_t from_incarnation,
                            const std::string& transfer_id, const std::string& owner,
                            const std::string& buffer_id, uint64_t offset, uint64_t length,
                            bool may_stage = true);
  // The bounce ring of a staged hold, taken now if it was left for later. Does not wait:
  // RESOURCE_EXHAUSTED while the pool has no room. NOT_FOUND: no such hold;
  // FAILED_PRECONDITION: the range is not staged.
  absl::StatusOr<Slots> TakeRing(const std::string& from_node, const std::string& transfer_id);
  // One chunk of a staged move between bounce slot `slot` (from `slot_offset` in it) and
  // the held range. The hold lives until the copy ends even if Complete ends it meanwhile
  // (a runner never does; a faulty or hostile peer may).
  absl::Status StageChunk(const std::string& from_node, const std::string& transfer_id,
                          uint32_t slot, uint64_t slot_offset, uint64_t offset, uint64_t length,
                          bool to_range);
  // Starts this node's half of a two-sided move (path MPI) on a held range: `start` gets
  // the held range and returns the running half. NOT_FOUND: no such hold;
  // ALREADY_EXISTS: one was started.
  using HalfStarter =
      std::function<absl::StatusOr<std::unique_ptr<PassiveHalf>>(const BufferUse& range)>;
  absl::Status StartHalf(const std::string& from_node, const std::string& transfer_id,
                         const HalfStarter& start);
  // Stops the sending half of a hold. NOT_FOUND: no such hold or half.
  absl::Status StopHalf(const std::string& from_node, const std::string& transfer_id);
  // Whether the hold has an MPI half (completing it may wait for that half).
  bool HasHalf(const std::string& from_node, const std::string& transfer_id) const;
  // Ends a hold; with `checksum`, hashes the range first. NOT_FOUND for no such hold. A
  // half is stopped first unless `runner_ok`, then waited for (up to `half_wait`); when
  // the runner says OK but the half failed, that is the answer. A `fence` (the runner's
  // GPU copy still running, CompleteRemoteRequest.fence) is waited for (up to
  // `fence_wait`) before the hold ends or is hashed; a fence this node cannot wait for
  // (no GPU, a handle the driver refuses, too slow) is the answer, and the hold ends.
  // The bytes still behind it (0: not known) set how long the driver is left alone first
  // (StagingPolicy::fence_quiet_rate). When the runner waits for its fence too
  // (fence.runner_waits) and no checksum is asked, a fence that has not passed is not
  // waited for here: the answer is OK at once, and the hold ends on a thread of the
  // table's own when it passes (or fails, or `fence_wait` runs out); meanwhile its range
  // is in an ending use (a Release waits for it) and size() counts it.
  absl::StatusOr<uint64_t> Complete(const std::string& from_node, const std::string& transfer_id,
                                    bool checksum, bool runner_ok = true,
                                    absl::Duration half_wait = absl::Seconds(2),
                                    const AckFence& fence = {},
                                    absl::Duration fence_wait = absl::Seconds(10));
  // Whether Complete with `fence` answers without waiting: the runner waits for its fence
  // itself, no checksum is asked, and this node has looked at that fence before (a first
  // look opens it, which can take the driver milliseconds).
  bool AnswersFenceAtOnce(const AckFence& fence, bool checksum) const;
  // Holds of staged ranges made without a ring since start (the pool was busy).
  uint64_t deferred() const { return deferred_.load(); }
  // Ends every hold of a node's incarnation (it went down or restarted); not those
  // already ending behind a fence (they end when it passes or times out).
  int ReleaseFrom(const std::string& node, uint64_t incarnation);
  size_t size() const;

 private:
  struct Entry {
    uint64_t incarnation = 0;
    BufferUse use;
    std::optional<BounceRing> ring;
    bool stage_later = false;  // Staged; the ring is taken by TakeRing.
    // Last: it uses the range, so it goes first.
    std::unique_ptr<PassiveHalf> half;
  };
  BufferRegistry* const registry_;
  const std::function<absl::StatusOr<uint64_t>(const Endpoint&, uint64_t)> hasher_;
  const StagingPolicy staging_;
  std::atomic<uint64_t> deferred_{0};
  mutable absl::Mutex mu_;
  // Key: from_node + '\n' + transfer_id.
  // Shared: a StageChunk copying into the range keeps its entry while it runs.
  absl::flat_hash_map<std::string, std::shared_ptr<Entry>> holds_ ABSL_GUARDED_BY(mu_);

  // Holds acknowledged before their fence passed, ended in order by `ender_` once
  // GpuRuntime::WaitIpcFence(device, fence, deadline, quiet_until) returns.
  struct FenceWait {
    int device = 0;
    std::string fence;
    absl::Time quiet_until, deadline;
  };
  struct Ending {
    std::shared_ptr<Entry> entry;
    std::string what;  // For the log: the transfer and its runner.
    FenceWait wait;
  };
  void EndLater(Ending ending);
  void EndLoop();
  std::deque<Ending> ending_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread ender_;  // Started with the first Ending.
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_CLUSTER_HOLDS_H_
