// The staging pipeline: moves bytes between device memory and a transport that only
// takes host memory, through a ring of pinned bounce buffers. Going out, chunk k is on
// the wire while chunk k+1 is copied off the GPU; coming in, chunk k is copied onto the
// GPU while chunk k+1 arrives. Any host-only transport (UCX without CUDA support, MPI
// without it) plugs in its send/receive; the GPU side is GpuRuntime::Copy, so with the
// host-only runtime the same code runs on host memory (that is how CI exercises it).
#ifndef GPUMOVE_DAEMON_PATH_STAGING_H_
#define GPUMOVE_DAEMON_PATH_STAGING_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/gpu/gpu.h"
#include "daemon/memory/pool.h"

namespace gpumove {

struct StagingOptions {
  uint64_t chunk = 8 << 20;  // Bytes per bounce buffer.
  int slots = 4;             // Bounce buffers per move.
};

// Runs `attempt` until it answers anything but RESOURCE_EXHAUSTED (room that others hold
// for now), the pause between tries doubling from a tenth of a millisecond to five; at
// `deadline` the last RESOURCE_EXHAUSTED is the answer, and CANCELLED as soon as `stop`
// says so. For bounce buffers: ours (BounceRing::TakeWaiting) and another node's (TakeStageSlots).
template <class T>
absl::StatusOr<T> RetryWhileBusy(absl::Time deadline, const std::function<bool()>& stop,
                                 const std::function<absl::StatusOr<T>()>& attempt) {
  for (absl::Duration pause = absl::Microseconds(100);;
       pause = std::min(2 * pause, absl::Milliseconds(5))) {
    absl::StatusOr<T> r = attempt();
    if (r.ok() || !absl::IsResourceExhausted(r.status())) return r;
    if (stop && stop()) return absl::CancelledError("cancelled while waiting for bounce buffers");
    if (absl::Now() + pause > deadline) return r;
    absl::SleepFor(pause);
  }
}

// What a move of `length` bytes needs of `options`: no more slots than it has chunks, and
// slots no bigger than the move (rounded up to 4 KiB), so that a small move does not hold
// megabytes of the pinned pool while it waits to run.
StagingOptions SizedFor(StagingOptions options, uint64_t length);

// Bounce buffers for one move, carved from the pinned pool and returned when done.
class BounceRing {
 public:
  // Takes `options.slots` buffers of `options.chunk` bytes (fewer, down to 2 or
  // `options.slots` if that is less, when the pool is short; RESOURCE_EXHAUSTED below that).
  static absl::StatusOr<BounceRing> Take(Pool* pinned, StagingOptions options);
  // Take, waiting for room while the pool is only busy (other moves' rings and buffers
  // in it) until `deadline`, or until `stop` says so (then CANCELLED); RESOURCE_EXHAUSTED
  // at once when the pool could never hold a ring (too small), or at the deadline.
  static absl::StatusOr<BounceRing> TakeWaiting(Pool* pinned, StagingOptions options,
                                                absl::Time deadline,
                                                const std::function<bool()>& stop = nullptr);
  // Whether `pinned` is big enough for a ring Take would accept, were it empty.
  static bool CouldFit(const Pool* pinned, StagingOptions options);
  // How long a move waits for bounce buffers (its own, or another node's) while other
  // moves use them; a cancel ends the wait sooner.
  static constexpr absl::Duration kWait = absl::Seconds(30);
  BounceRing(BounceRing&& other) noexcept;
  ~BounceRing();

  size_t slots() const { return slots_.size(); }
  uint64_t chunk() const { return chunk_; }
  char* slot(size_t i) const { return slots_[i]; }

 private:
  BounceRing(Pool* pool, uint64_t chunk) : pool_(pool), chunk_(chunk) {}
  Pool* pool_;
  uint64_t chunk_;
  std::vector<char*> slots_;
};

// Sends host bytes [host, host+n) to the wire at `offset` of the move.
using StageSend = std::function<absl::Status(const char* host, uint64_t offset, uint64_t n)>;
// Fills [host, host+n) from the wire at `offset` of the move.
using StageReceive = std::function<absl::Status(char* host, uint64_t offset, uint64_t n)>;
// Bytes known done; false stops the move (it then returns CANCELLED).
using StageProgress = std::function<bool(uint64_t done)>;

// The ring itself: `produce(slot, offset, n)` runs on a helper thread and fills slot
// `slot` with chunk [offset, offset+n); `consume(slot, offset, n)` runs on the calling
// thread and drains it; a slot is reused only after it was drained. Chunks are `chunk`
// bytes, `slots` at most in flight. With `consumers` > 1 that many helper threads drain
// chunks at once (claimed in order; for a consume step that is mostly waiting, such as a
// round trip to another node), and progress counts the chunks drained in a row from the
// start.
using StageStep = std::function<absl::Status(size_t slot, uint64_t offset, uint64_t n)>;
absl::Status RunStaged(uint64_t length, uint64_t chunk, size_t slots, const StageStep& produce,
                       const StageStep& consume, const StageProgress& progress, int consumers = 1);

// A chunk of a three-step pipeline: its slot in the first ring (`a`, between the first
// and second steps) and in the second (`b`, between the second and third), and its bytes.
using StageHop = std::function<absl::Status(size_t a, size_t b, uint64_t offset, uint64_t n)>;
struct ThreeSteps {
  StageHop fill;   // Fills a-slot `a` with the chunk.
  StageHop carry;  // Moves a-slot `a` into b-slot `b` (then `a` is free).
  StageHop drain;  // Empties b-slot `b` (then `b` is free); the chunk has landed.
  // Threads each step runs on (chunks at once in it): more than one for a step that is
  // mostly a round trip to another node (its wait then overlaps the next chunk's), or
  // that gets more of a shared resource with two at once.
  int fill_threads = 1;
  int carry_threads = 1;
  int drain_threads = 1;
};
// Each step takes the chunks in order and runs on threads of its own, so chunk k+1 fills
// while chunk k is carried and k-1 drains; this thread reports progress (the chunks
// drained in a row) and carries a cancel. A slot is reused once every chunk before it let
// go of it. The first error stops every step; false from progress stops it with CANCELLED.
// A move of one chunk runs its steps one after another on this thread (nothing to overlap,
// and the hand-offs would cost it a third of its speed).
absl::Status RunThreeSteps(uint64_t length, uint64_t chunk, size_t a_slots, size_t b_slots,
                           const ThreeSteps& steps, const StageProgress& progress);

// The piece size for a move of `length` through slots of `slot` bytes: about a sixteenth
// of the move, so that filling and draining a pipeline of three steps costs it little, but
// no smaller than kMinStagePiece (each piece is a GPU copy and a call) nor bigger than a
// slot; a multiple of 4 KiB.
uint64_t StagePiece(uint64_t length, uint64_t slot);
inline constexpr uint64_t kMinStagePiece = 1 << 20;

// device -> bounce -> send. `device` is a GPU index (kHostDevice with host memory
// standing in for a GPU). `senders` > 1 sends that many chunks at once: only for a send
// whose chunks may land in any order (RMA to distinct offsets; not MPI's ordered sends).
absl::Status StageOut(GpuRuntime* gpu, const char* src, int device, uint64_t length,
                      const BounceRing& ring, const StageSend& send, const StageProgress& progress,
                      int senders = 1);
// receive -> bounce -> device.
absl::Status StageIn(GpuRuntime* gpu, char* dst, int device, uint64_t length,
                     const BounceRing& ring, const StageReceive& receive,
                     const StageProgress& progress);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_STAGING_H_
