#include "daemon/common/status_macros.h"
#include "daemon/staging/staging.h"

#include <algorithm>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "daemon/common/thread_pool.h"

namespace gpumove {

StagingOptions SizedFor(StagingOptions options, uint64_t length) {
  const uint64_t rounded = std::max<uint64_t>((length + 4095) & ~uint64_t{4095}, 4096);
  options.chunk = std::max<uint64_t>(std::min(options.chunk, rounded), 1);
  const uint64_t chunks = (length + options.chunk - 1) / options.chunk;
  options.slots = static_cast<int>(std::clamp<uint64_t>(chunks, 1, std::max(options.slots, 1)));
  return options;
}

absl::StatusOr<BounceRing> BounceRing::Take(Pool* pinned, StagingOptions options) {
  if (pinned == nullptr) return absl::FailedPreconditionError("no pinned pool for staging");
  BounceRing ring(pinned, options.chunk);
  for (int i = 0; i < options.slots; ++i) {
    auto slot = pinned->Allocate(options.chunk);
    if (!slot.ok()) break;
    ring.slots_.push_back(*slot);
  }
  const size_t least = std::min(2, std::max(options.slots, 1));
  if (ring.slots_.size() < least) {
    return absl::ResourceExhaustedError(absl::StrCat("the pinned pool has no room for ", least, " ",
                                                     options.chunk, "-byte staging buffer(s)"));
  }
  return ring;
}

bool BounceRing::CouldFit(const Pool* pinned, StagingOptions options) {
  const uint64_t least = std::min(2, std::max(options.slots, 1));
  return pinned != nullptr && pinned->Stats().capacity >= least * options.chunk;
}

absl::StatusOr<BounceRing> BounceRing::TakeWaiting(Pool* pinned, StagingOptions options,
                                                   absl::Time deadline,
                                                   const std::function<bool()>& stop) {
  if (!CouldFit(pinned, options)) return Take(pinned, options);  // Waiting cannot help.
  return RetryWhileBusy<BounceRing>(deadline, stop, [&] { return Take(pinned, options); });
}

BounceRing::BounceRing(BounceRing&& other) noexcept
    : pool_(other.pool_), chunk_(other.chunk_), slots_(std::move(other.slots_)) {
  other.slots_.clear();
}

BounceRing::~BounceRing() {
  for (char* s : slots_) pool_->Free(s);
}

namespace {

// How a pipeline ends: the first error (or a cancel, or OK once done) stops every step.
class PipelineEnd {
 public:
  // Ends the pipeline with `status` (the first one wins); every step stops waiting.
  void Stop(absl::Status status) {
    absl::MutexLock lock(&mu_);
    if (status_.ok()) status_ = std::move(status);
    stop_ = true;
  }
  absl::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 protected:
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

 private:
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// A bounded ring between a producer and a consumer thread: slot k is filled by the
// producer, drained by the consumer, then reused for chunk k + slots.
class Pipeline : public PipelineEnd {
 public:
  explicit Pipeline(size_t slots) : slots_(slots) {}

  // Producer side: waits until chunk k's slot is free; false when the pipeline stopped.
  bool AwaitFree(uint64_t k) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || k < drained_ + slots_; };
    mu_.Await(absl::Condition(&ready));
    return !stop_;
  }
  void Filled() {
    absl::MutexLock lock(&mu_);
    ++filled_;
  }
  // Consumer side: waits until chunk k is filled; false when the pipeline stopped.
  bool AwaitFilled(uint64_t k) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || k < filled_; };
    mu_.Await(absl::Condition(&ready));
    return k < filled_;
  }
  void Drained() {
    absl::MutexLock lock(&mu_);
    ++drained_;
  }
  // Several consumers: claims the next chunk to drain, in order; false when there is none
  // left or the pipeline stopped.
  bool Claim(uint64_t chunks, uint64_t* k) {
    absl::MutexLock lock(&mu_);
    if (stop_ || next_ >= chunks) return false;
    *k = next_++;
    return true;
  }
  // Chunk k is drained; the drained count moves over every chunk done in a row.
  void DrainedChunk(uint64_t k) {
    absl::MutexLock lock(&mu_);
    done_.insert(k);
    while (done_.erase(drained_) > 0) ++drained_;
  }
  // Waits until more than `seen` chunks are drained in a row, or the pipeline stopped;
  // returns how many are.
  uint64_t AwaitDrainedPast(uint64_t seen) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || drained_ > seen; };
    mu_.Await(absl::Condition(&ready));
    return drained_;
  }

 private:
  const size_t slots_;
  uint64_t filled_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t drained_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;                   // Next chunk to claim.
  absl::flat_hash_set<uint64_t> done_ ABSL_GUARDED_BY(mu_);  // Drained out of order.
};

// Tells `progress` the bytes landed as chunks are drained in a row (AwaitDrainedPast of a
// Pipeline or ThreeStepState), until all are or the pipeline stopped; a progress that says
// no stops it with CANCELLED. Run by the thread that started the pipeline.
template <class State>
void TellLanded(State& state, uint64_t length, uint64_t chunk, const StageProgress& progress) {
  const uint64_t chunks = (length + chunk - 1) / chunk;
  for (uint64_t told = 0; told < chunks;) {
    const uint64_t drained = state.AwaitDrainedPast(told);
    if (drained == told) return;  // Stopped.
    told = drained;
    const uint64_t bytes = std::min(length, drained * chunk);
    if (progress && !progress(bytes) && bytes < length) {
      state.Stop(absl::CancelledError("cancelled"));
      return;
    }
  }
}

// The pipelines' helper threads, kept: a new thread per move, and its first CUDA call,
// delayed a staged move's first chunk. No limit: a pipeline's threads wait for each other.
ThreadPool& StagePool() {
  static ThreadPool* pool = new ThreadPool(0);
  return *pool;
}

}  // namespace

absl::Status RunStaged(uint64_t length, uint64_t chunk, size_t slots, const StageStep& produce,
                       const StageStep& consume, const StageProgress& progress, int consumers) {
  const uint64_t chunks = (length + chunk - 1) / chunk;
  Pipeline pipe(slots);
  absl::Notification produced;
  StagePool().Run([&] {
    absl::Cleanup done = [&produced] { produced.Notify(); };
    for (uint64_t k = 0; k < chunks; ++k) {
      if (!pipe.AwaitFree(k)) return;
      const uint64_t offset = k * chunk;
      absl::Status st = produce(k % slots, offset, std::min(chunk, length - offset));
      if (!st.ok()) {
        pipe.Stop(st);
        return;
      }
      pipe.Filled();
    }
  });
  if (consumers <= 1 || chunks <= 1) {
    for (uint64_t k = 0; k < chunks; ++k) {
      if (!pipe.AwaitFilled(k)) break;
      const uint64_t offset = k * chunk;
      const uint64_t n = std::min(chunk, length - offset);
      absl::Status st = consume(k % slots, offset, n);
      if (!st.ok()) {
        pipe.Stop(st);
        break;
      }
      pipe.Drained();
      if (progress && !progress(offset + n) && offset + n < length) {
        pipe.Stop(absl::CancelledError("cancelled"));
        break;
      }
    }
    pipe.Stop(absl::OkStatus());
    produced.WaitForNotification();
    return pipe.status();
  }
  // Several consumers (never more than the slots can keep busy); this thread reports
  // progress and cancels.
  const int n_consumers = static_cast<int>(
      std::min<uint64_t>({static_cast<uint64_t>(consumers), static_cast<uint64_t>(slots), chunks}));
  absl::BlockingCounter drained(n_consumers);
  for (int i = 0; i < n_consumers; ++i) {
    StagePool().Run([&] {
      absl::Cleanup done = [&drained] { drained.DecrementCount(); };
      uint64_t k = 0;
      while (pipe.Claim(chunks, &k)) {
        if (!pipe.AwaitFilled(k)) return;
        const uint64_t offset = k * chunk;
        absl::Status st = consume(k % slots, offset, std::min(chunk, length - offset));
        if (!st.ok()) {
          pipe.Stop(st);
          return;
        }
        pipe.DrainedChunk(k);
      }
    });
  }
  TellLanded(pipe, length, chunk, progress);
  pipe.Stop(absl::OkStatus());
  produced.WaitForNotification();
  drained.Wait();
  return pipe.status();
}

uint64_t StagePiece(uint64_t length, uint64_t slot) {
  const uint64_t sixteenth = ((length / 16) + 4095) & ~uint64_t{4095};
  return std::max<uint64_t>(std::min(std::max(sixteenth, kMinStagePiece), slot), 1);
}

namespace {

// Where the chunks of a three-step pipeline are: the next each step takes, and those
// done (in a row from the start, and out of order past that).
class ThreeStepState : public PipelineEnd {
 public:
  enum Step { kFill = 0, kCarry = 1, kDrain = 2 };

  ThreeStepState(uint64_t chunks, size_t a_slots, size_t b_slots)
      : chunks_(chunks), a_slots_(a_slots), b_slots_(b_slots) {}

  // Claims the next chunk of `step` and waits until it may run: its slot is free and the
  // step before is done with it. False when there is none left or the pipeline stopped.
  bool Next(Step step, uint64_t* k) {
    absl::MutexLock lock(&mu_);
    if (stop_ || next_[step] >= chunks_) return false;
    const uint64_t c = next_[step]++;
    *k = c;
    auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      if (stop_) return true;
      switch (step) {
        case kFill:  // Its a-slot carried out by every chunk before that used it.
          return c < in_row_[kCarry] + a_slots_;
        case kCarry:  // Filled, and its b-slot drained by every chunk before.
          return filled_.contains(c) && c < in_row_[kDrain] + b_slots_;
        case kDrain:
          return c < in_row_[kCarry];
      }
      return true;
    };
    mu_.Await(absl::Condition(&ready));
    return !stop_;
  }
  void Done(Step step, uint64_t k) {
    absl::MutexLock lock(&mu_);
    if (step == kFill) {  // Looked up (and let go) by carry, which takes them in order.
      filled_.insert(k);
      return;
    }
    if (step == kCarry) filled_.erase(k);
    done_[step].insert(k);
    while (done_[step].erase(in_row_[step]) > 0) ++in_row_[step];
  }
  // Waits until more than `seen` chunks are drained in a row, or the pipeline stopped.
  uint64_t AwaitDrainedPast(uint64_t seen) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || in_row_[kDrain] > seen; };
    mu_.Await(absl::Condition(&ready));
    return in_row_[kDrain];
  }

 private:
  const uint64_t chunks_;
  const size_t a_slots_;
  const size_t b_slots_;
  uint64_t next_[3] ABSL_GUARDED_BY(mu_) = {0, 0, 0};
  uint64_t in_row_[3] ABSL_GUARDED_BY(mu_) = {0, 0, 0};  // Done in a row (carry, drain).
  absl::flat_hash_set<uint64_t> filled_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> done_[3] ABSL_GUARDED_BY(mu_);  // Past in_row_.
};

}  // namespace

absl::Status RunThreeSteps(uint64_t length, uint64_t chunk, size_t a_slots, size_t b_slots,
                           const ThreeSteps& steps, const StageProgress& progress) {
  if (length == 0) return absl::OkStatus();
  if (chunk == 0 || a_slots == 0 || b_slots == 0) {
    return absl::InvalidArgumentError("a staged pipeline needs a chunk size and slots");
  }
  const uint64_t chunks = (length + chunk - 1) / chunk;
  if (chunks == 1) {
    // Nothing to overlap: the three steps on this thread, without hand-offs.
    for (const StageHop* step : {&steps.fill, &steps.carry, &steps.drain}) {
      GPUMOVE_RETURN_IF_ERROR((*step)(0, 0, 0, length));
    }
    if (progress) progress(length);
    return absl::OkStatus();
  }
  ThreeStepState state(chunks, a_slots, b_slots);
  auto hop = [&](const StageHop& step, uint64_t k) {
    return step(k % a_slots, k % b_slots, k * chunk, std::min(chunk, length - k * chunk));
  };
  auto run = [&](ThreeStepState::Step step, const StageHop& what) {
    for (uint64_t k = 0; state.Next(step, &k);) {
      absl::Status st = hop(what, k);
      if (!st.ok()) {
        state.Stop(std::move(st));
        return;
      }
      state.Done(step, k);
    }
  };
  // No more threads for a step than it has chunks and slots to work on at once.
  auto threads = [chunks](int wanted, size_t slots) {
    return static_cast<int>(std::min<uint64_t>(
        {static_cast<uint64_t>(std::max(wanted, 1)), chunks, static_cast<uint64_t>(slots)}));
  };
  const int fillers = threads(steps.fill_threads, a_slots);
  const int carriers = threads(steps.carry_threads, std::min(a_slots, b_slots));
  const int drainers = threads(steps.drain_threads, b_slots);
  absl::BlockingCounter finished(fillers + carriers + drainers);
  for (int i = 0; i < fillers + carriers + drainers; ++i) {
    const ThreeStepState::Step step = i < fillers              ? ThreeStepState::kFill
                                      : i < fillers + carriers ? ThreeStepState::kCarry
                                                               : ThreeStepState::kDrain;
    StagePool().Run([&, step] {
      absl::Cleanup done = [&finished] { finished.DecrementCount(); };
      run(step, step == ThreeStepState::kFill    ? steps.fill
                : step == ThreeStepState::kCarry ? steps.carry
                                                 : steps.drain);
    });
  }
  TellLanded(state, length, chunk, progress);
  state.Stop(absl::OkStatus());
  finished.Wait();
  return state.status();
}

absl::Status StageOut(GpuRuntime* gpu, const char* src, int device, uint64_t length,
                      const BounceRing& ring, const StageSend& send, const StageProgress& progress,
                      int senders) {
  return RunStaged(
      length, ring.chunk(), ring.slots(),
      [&](size_t slot, uint64_t offset, uint64_t n) {
        return gpu->Copy(ring.slot(slot), kHostDevice, src + offset, device, n, n, nullptr);
      },
      [&](size_t slot, uint64_t offset, uint64_t n) { return send(ring.slot(slot), offset, n); },
      progress, senders);
}

absl::Status StageIn(GpuRuntime* gpu, char* dst, int device, uint64_t length,
                     const BounceRing& ring, const StageReceive& receive,
                     const StageProgress& progress) {
  // The wire fills the ring (producer thread); this thread copies onto the GPU, so the
  // progress it reports counts bytes that have landed in device memory.
  return RunStaged(
      length, ring.chunk(), ring.slots(),
      [&](size_t slot, uint64_t offset, uint64_t n) { return receive(ring.slot(slot), offset, n); },
      [&](size_t slot, uint64_t offset, uint64_t n) {
        return gpu->Copy(dst + offset, device, ring.slot(slot), kHostDevice, n, n, nullptr);
      },
      progress);
}

}  // namespace gpumove
