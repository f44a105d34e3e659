// MpiEngine's passive half: the half of a move another node runs that this node serves
// (StartPassive, called for StartMpi or with the hold), on a thread of its own or, for a
// small receive, as receives all posted at once.
#include <atomic>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "daemon/common/log.h"
#include "daemon/path/mpi/mpi_engine.h"
#include "daemon/path/mpi/mpi_sender_stopped.h"

namespace gpumove {
namespace {

class Passive : public PassiveHalf {
 public:
  ~Passive() override {
    Stop();
    if (thread_.joinable()) thread_.join();
  }
  void Stop() override { stop_.store(true); }
  absl::Status Wait(absl::Time deadline) override {
    if (!done_.WaitForNotificationWithDeadline(deadline)) {
      return absl::DeadlineExceededError("this node's half of the MPI move has not finished");
    }
    return status_;
  }

  std::atomic<bool> stop_{false};
  absl::Notification posted_;
  absl::Notification done_;
  absl::Status status_;
  std::thread thread_;
};

// A receiving half whose receives are all posted at once (a range of at most `window`
// chunks in memory MPI takes): no thread of its own, and Wait returns as soon as MPI has
// the bytes. What the threaded receive does between chunks does not arise: with every
// receive posted, the sender's zero-byte stop message lands in the first one unmatched.
class PostedReceive : public PassiveHalf {
 public:
  explicit PostedReceive(MpiTransport* mpi) : mpi_(mpi) {}
  ~PostedReceive() override {
    std::vector<std::shared_ptr<MpiTransport::Op>> rest;
    for (size_t i = next_; i < ops_.size(); ++i) rest.push_back(ops_[i].first);
    if (!rest.empty()) mpi_->CancelReceives(rest);
  }
  // A receiver keeps receiving until the sender says it stopped.
  void Stop() override { stop_ = true; }
  absl::Status Wait(absl::Time deadline) override {
    while (status_.ok() && next_ < ops_.size()) {
      auto& [op, n] = ops_[next_];
      auto r = mpi_->Wait(op, deadline);
      if (!r.ok() && r.status().code() == absl::StatusCode::kDeadlineExceeded) {
        return absl::DeadlineExceededError("this node's half of the MPI move has not finished");
      }
      ++next_;
      if (!r.ok()) {
        status_ = r.status();
      } else if (*r == 0) {
        status_ = stop_ ? absl::CancelledError("cancelled") : absl::AbortedError(kSenderStopped);
      } else if (*r != n) {
        status_ = absl::DataLossError(
            absl::StrCat("chunk ", next_ - 1, ": ", *r, " bytes came, ", n, " expected"));
      }
    }
    return status_;
  }

  std::vector<std::pair<std::shared_ptr<MpiTransport::Op>, uint64_t>> ops_;

 private:
  MpiTransport* const mpi_;
  std::atomic<bool> stop_{false};
  size_t next_ = 0;  // Receives before it have ended.
  absl::Status status_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PassiveHalf>> MpiEngine::StartPassive(
    const Endpoint& range, uint64_t length, int runner_rank, int tag, uint64_t chunk, bool send,
    bool patient, uint64_t listed, const KnownPieces* known, OnPieceList on_list) {
  if (runner_rank < 0 || runner_rank >= mpi_->world().size || runner_rank == mpi_->world().rank) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", runner_rank, " is not another rank"));
  }
  if (tag <= 0 || tag >= mpi_->wake_tag() || chunk == 0 || chunk > (1ull << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("bad MPI tag ", tag, " or chunk ", chunk));
  }
  if (Staged(range) && pinned_ == nullptr) {
    return absl::FailedPreconditionError(
        "this node has no pinned pool to stage device memory for MPI");
  }
  if (listed > kMaxHalfPieces) {
    return absl::InvalidArgumentError(
        absl::StrCat(listed, " pieces to come as a message (at most ", kMaxHalfPieces, ")"));
  }
  std::shared_ptr<const std::vector<Segment>> packed;
  if (known != nullptr) {
    if (listed > 0 || known->pieces == nullptr || known->end > length) {
      return absl::InvalidArgumentError("kept pieces besides others, or past the range");
    }
    packed = known->pieces;
    length = known->total;
  }
  if (packed == nullptr && listed == 0 && !send && !Staged(range) &&
      (length + chunk - 1) / chunk <= uint64_t(options_.window)) {
    auto posted = std::make_unique<PostedReceive>(mpi_);
    for (uint64_t offset = 0; offset < length; offset += chunk) {
      const uint64_t n = std::min(chunk, length - offset);
      posted->ops_.emplace_back(mpi_->Irecv(range.data + offset, n, runner_rank, tag, patient), n);
    }
    return posted;
  }
  auto half = std::make_unique<Passive>();
  Passive* p = half.get();
  Side side;
  side.local = range;
  side.length = length;
  side.peer = runner_rank;
  side.tag = tag;
  side.chunk = chunk;
  side.patient = patient;
  side.pieces = std::move(packed);
  side.list_serial = known != nullptr ? known->serial : 0;
  side.progress = [p](uint64_t) { return !p->stop_.load(); };
  const bool await_go = known != nullptr && send;
  p->thread_ = std::thread([this, p, side, send, listed, await_go, on_list = std::move(on_list),
                            range_length = length]() mutable {
    auto notify_posted = [p] {
      if (!p->posted_.HasBeenNotified()) p->posted_.Notify();
    };
    // The half ends before it moves a byte (no bounce ring came free, its go or list did
    // not come as they should). Done before posted: StartPassive then returns the error.
    auto end_early = [&](const char* what, const absl::Status& st) {
      if (!IsSenderStopped(st) && !absl::IsResourceExhausted(st)) {
        LOG(WARNING) << "MPI half for rank " << side.peer << ", tag " << side.tag << ": its "
                     << what << ": " << st;
      }
      p->status_ = st;
      p->done_.Notify();
      notify_posted();
    };
    // A staged whole range's bounce ring before its StartMpi returns: when none comes free
    // in time the runner hears so at once (and tries again) instead of sending to a
    // receiver that never posts, or waiting on a sender that never sends.
    std::optional<BounceRing> own;
    if (side.pieces == nullptr && listed == 0 && Staged(side.local)) {
      auto ring = RingOf(side, own);
      if (!ring.ok()) return end_early("bounce ring", ring.status());
      side.ring = *ring;
    }
    if (await_go) {
      // A pull's sender with its pieces known: not before the runner's receives are posted.
      absl::Status go = ReceiveGo(side.peer, side.tag, side.patient, notify_posted);
      if (!go.ok()) return end_early("go", go);
    }
    if (listed > 0) {
      uint64_t total = 0;
      auto got = ReceivePieceList(side.peer, side.tag, listed, range_length, notify_posted, &total,
                                  side.patient);
      if (!got.ok()) return end_early("piece list", got.status());
      side.pieces = *std::move(got);
      side.length = total;
      if (on_list) {
        uint64_t end = 0;
        for (const Segment& s : *side.pieces) end = std::max(end, s.src + s.length);
        side.list_serial = NextListSerial();
        on_list(KnownPieces{side.pieces, total, end, side.list_serial});
      }
    }
    if (send) {
      notify_posted();
      p->status_ = Send(side);
    } else {
      p->status_ = Receive(
          side,
          [notify_posted] {
            notify_posted();
            return absl::OkStatus();
          },
          [] {});
    }
    // Done before posted when it ended before posting: StartPassive returns the error.
    const bool was_posted = p->posted_.HasBeenNotified();
    p->done_.Notify();
    if (!was_posted) p->posted_.Notify();
  });
  p->posted_.WaitForNotification();
  if (p->done_.HasBeenNotified() && !p->status_.ok()) return p->status_;
  return half;
}

}  // namespace gpumove
