// The daemon's MPI library use, all of it: one thread initialises MPI, makes every MPI call
// and finalises it; other threads hand it point-to-point operations and wait for them.
// Built against Open MPI (default), MPICH (--config=mpich) or without MPI
// (--config=nompi: Start says so). Only its files (mpi_transport*) include mpi.h.
#ifndef GPUMOVE_DAEMON_PATH_MPI_TRANSPORT_H_
#define GPUMOVE_DAEMON_PATH_MPI_TRANSPORT_H_

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
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gpumove {

struct MpiOptions {
  // An operation with no completion this long fails UNAVAILABLE (the peer is also failed
  // at once when the cluster sees it down; this is the backstop).
  absl::Duration op_timeout = absl::Seconds(30);
  // MPI moves bytes only while it is polled (ob1's single-copy receives copy inside
  // MPI_Testsome; copy-in/copy-out shared memory and TCP move a fragment at a time): the
  // MPI thread polls without pause while a send, a receive of a running move or a woken
  // patient receive (see Wake) is in flight, and for this long after a completion or a
  // new operation; then, with only patient receives left, it naps (new work or a wake
  // ends a nap).
  absl::Duration poll_window = absl::Milliseconds(2);
  // With CPUs to spare: the MPI thread also polls through poll_window when it has no
  // operation at all (instead of blocking until one is posted), and Wait polls up to
  // 50 microseconds for its operation before it blocks. A small move then wakes no thread on its
  // way into MPI or back out (docs/performance/tuning.md).
  bool spin = false;
};

// What MPI said about this job at start.
struct MpiWorld {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // Rank among the job's processes on this host.
  int local_size = 1;
  int tag_ub = 32767;
  bool cuda_aware = false;     // Device pointers may be given to MPI.
  std::string cuda_awareness;  // How that was found out.
  std::string library;         // MPI_Get_library_version, first line.
  uint64_t world_id = 0;       // The same on every rank of the job, random per job.
};

// The parts of one message (MpiTransport::IsendParts): part i is lengths[i] bytes at
// data + at[i] (MPI_Type_create_hindexed), or with `lengths` empty `block` bytes each
// (MPI_Type_create_hindexed_block).
struct MpiParts {
  std::vector<int64_t> at;
  std::vector<int> lengths;
  uint64_t block = 0;
  uint64_t bytes() const;
};

class MpiTransport {
 public:
  // True when a launcher started this process as an MPI rank (Open MPI's mpirun, MPICH's
  // Hydra, PMIx/PMI launchers such as Slurm's srun --mpi=pmix).
  static bool LaunchedByMpi();
  // Starts the MPI thread and initialises MPI on it (collective across the job).
  static absl::StatusOr<std::unique_ptr<MpiTransport>> Start(MpiOptions options);
  // Finalises MPI (collective; gives up after a few seconds when peers are gone).
  ~MpiTransport();

  const MpiWorld& world() const { return world_; }

  // Every rank calls this once, in the same order as other collectives: returns each
  // rank's string, indexed by rank.
  absl::StatusOr<std::vector<std::string>> Allgather(const std::string& mine);

  // One posted send or receive.
  struct Op;
  // Posts a send of [data, data+n) to `peer` (n may be 0). The bytes must stay put until
  // Wait returns OK.
  std::shared_ptr<Op> Isend(const void* data, uint64_t n, int peer, int tag);
  // Posts a receive of at most n bytes from `peer` into [data, data+n). A `patient` one
  // is not timed out (it waits for a sender that may start much later, such as a move
  // queued behind others; FailPeer still ends it).
  std::shared_ptr<Op> Irecv(void* data, uint64_t n, int peer, int tag, bool patient = false);
  // One message of scattered parts described to MPI as a derived datatype of bytes, which
  // MPI packs or unpacks itself (see MpiParts). At most INT_MAX bytes in all; a receive's
  // count is the bytes that came. Vectored moves use them (MpiEngineOptions::datatypes),
  // and gpumove-bench mpi_datatype measures them against packing.
  using Parts = MpiParts;
  std::shared_ptr<Op> IsendParts(const void* data, Parts parts, int peer, int tag);
  std::shared_ptr<Op> IrecvParts(void* data, Parts parts, int peer, int tag, bool patient = false);
  // Tells `peer` that this rank now starts sending under `tag`: its patient receives for
  // them count as running (polled without naps) before their first message ends. One
  // small message under the reserved tag wake_tag(); not waited for.
  void Wake(int peer, int tag);
  // The tag Wake uses; moves use tags below it.
  int wake_tag() const { return world_.tag_ub; }
  // Bytes sent or received. UNAVAILABLE when the peer was failed (see FailPeer) or the
  // operation timed out, and the library's error otherwise. A receive that fails is
  // cancelled first, so its buffer is free once this returns.
  absl::StatusOr<uint64_t> Wait(const std::shared_ptr<Op>& op);
  // The same, but DEADLINE_EXCEEDED (the operation left as it is) when it has not ended
  // by `deadline`.
  absl::StatusOr<uint64_t> Wait(const std::shared_ptr<Op>& op, absl::Time deadline);
  // Cancels posted receives and waits until MPI is done with their buffers, or `wait`
  // passed (a receive already matched to a rank that died may never end; it is logged).
  void CancelReceives(const std::vector<std::shared_ptr<Op>>& ops,
                      absl::Duration wait = absl::Seconds(1));
  // Fails every operation now pending with `peer` (it died or stopped answering): their
  // waits return UNAVAILABLE and receives are cancelled. Later operations are tried anew.
  void FailPeer(int peer, const std::string& why);

  // Operations MPI has not finished (for tests and shutdown).
  size_t pending() const;

 private:
  explicit MpiTransport(MpiOptions options) : options_(options) {}
  // The MPI thread's loop and its steps (mpi_transport_loop.cc), over state of its own kept
  // from one round to the next.
  struct LoopState;
  void Loop();
  // New work for this thread (ends a wait or a nap).
  bool NewWork() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Takes the queued work (waiting for some while MPI has none); false: stopping, with
  // every operation finished.
  bool TakeWork(LoopState& loop, std::deque<std::shared_ptr<Op>>& post,
                std::deque<std::shared_ptr<Op>>& cancel, std::deque<std::function<void()>>& tasks)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Hands `op` to MPI (into loop.ops), or finishes it with the library's error.
  void PostOp(LoopState& loop, std::shared_ptr<Op>& op) ABSL_LOCKS_EXCLUDED(mu_);
  // Cancels receive loop.ops[i] (once; sends are not cancelled).
  void CancelAt(LoopState& loop, size_t i);
  void PostWake(LoopState& loop);
  // Marks the patient receives each wake that came is for.
  void TakeWakes(LoopState& loop);
  void StopWakes(LoopState& loop);
  void TimeOut(LoopState& loop) ABSL_LOCKS_EXCLUDED(mu_);
  // MPI_Testsome over loop.ops: finishes and drops what completed, or naps or polls.
  void TestOps(LoopState& loop) ABSL_LOCKS_EXCLUDED(mu_);
  void NapOrPoll(LoopState& loop) ABSL_LOCKS_EXCLUDED(mu_);
  void FinishCompleted(LoopState& loop, int completed, int rc) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends `op`: MPI is done with its buffer, and its waiters get `status` (unless it was
  // reported failed before, as a send that timed out).
  void Finish(Op& op, absl::Status status, uint64_t count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs fn on the MPI thread and waits for it.
  absl::Status RunOnMpiThread(std::function<absl::Status()> fn);
  // `wake`: a wake (see Wake) telling `peer` about this tag; the only ops under wake_tag().
  // `parts`: a message of scattered parts (see IsendParts), n = their bytes.
  std::shared_ptr<Op> Post(bool send, void* data, uint64_t n, int peer, int tag,
                           absl::Duration timeout, bool patient = false,
                           std::optional<int32_t> wake = std::nullopt, Parts parts = {});

  const MpiOptions options_;
  MpiWorld world_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<Op>> to_post_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<Op>> to_cancel_ ABSL_GUARDED_BY(mu_);
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, uint64_t> peer_generation_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, std::string> peer_failure_ ABSL_GUARDED_BY(mu_);
  size_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool finalized_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_MPI_TRANSPORT_H_
