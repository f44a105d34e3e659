// MpiEngine's moving side: the runner's half of a move (RunMove, which starts the other
// node's half), tags, the hold handshake (PrepareAsk, Abandon), and the Send and Receive
// drivers both halves run. The other node's half is in mpi_passive.cc, vectored messages in
// mpi_vectored.cc, the piece list and go messages in mpi_piece_list.cc.
#include "daemon/path/mpi/mpi_engine.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <string>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/common/log.h"
#include "daemon/path/mpi/mpi_sender_stopped.h"

namespace gpumove {

int MpiEngine::NextTag() {
  // Tags only need to differ among this runner's moves still in flight with one peer;
  // they go round the library's tag space (at least 32767 values) below the transport's
  // wake tag. Tag 0 is not used.
  const uint64_t ub = static_cast<uint64_t>(mpi_->wake_tag()) - 1;
  return static_cast<int>(next_tag_.fetch_add(1) % ub) + 1;
}

absl::Status MpiEngine::CanServe(const Endpoint& src, const Endpoint& dst) const {
  if ((src.remote == nullptr) == (dst.remote == nullptr)) {
    return absl::FailedPreconditionError("MPI moves need exactly one end on another node");
  }
  const RemoteHold& remote = src.remote != nullptr ? *src.remote : *dst.remote;
  if (remote.offer<MpiOffer>() == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", remote.node, " is not a rank of this node's MPI job"));
  }
  const Endpoint& local = src.remote != nullptr ? dst : src;
  if (Staged(local) && pinned_ == nullptr) {
    return absl::FailedPreconditionError(
        "staging device memory for a host-only MPI needs a pinned pool on this node "
        "(--pinned_pool_size)");
  }
  return absl::OkStatus();
}

absl::Status MpiEngine::Move(const Endpoint& src, const Endpoint& dst, uint64_t length,
                             MoveControl& control) {
  return RunMove(src, dst, length, nullptr, control);
}

absl::Status MpiEngine::MovePieces(const Endpoint& src, const Endpoint& dst, const Segments& pieces,
                                   MoveControl& control) {
  return RunMove(src, dst, pieces.total, &pieces, control);
}

absl::Status MpiEngine::RunMove(const Endpoint& src, const Endpoint& dst, uint64_t length,
                                const Segments* pieces, MoveControl& control) {
  if (control.cancelled()) return absl::CancelledError("cancelled");
  const bool push = dst.remote != nullptr;
  const RemoteHold& hold = push ? *dst.remote : *src.remote;
  const MpiOffer* offer = hold.offer<MpiOffer>();
  if (offer == nullptr) return CanServe(src, dst);
  if (!control.required_transport().empty() && !hold.same_host) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the move requires ", control.required_transport(), " between hosts, and MPI does not "
        "say what carries its messages: move over path UCX to hold it to that"));
  }
  Side side;
  side.local = push ? src : dst;
  side.length = length;
  side.peer = offer->rank;
  // A half the other node started with the hold (a push's receiver, or either half of a
  // vectored move, which then waits for its pieces) runs under the hold's tag and chunk;
  // no StartMpi call.
  const bool started = offer->started_tag != 0;
  if (started && !push && pieces == nullptr) {
    return absl::InternalError("the sender of a whole-range pull started with its hold");
  }
  side.tag = started ? offer->started_tag : NextTag();
  side.chunk = started ? offer->started_chunk
                       : ChunkFor(side.local.kind == MemoryKind::kDevice, pieces != nullptr);
  // Receives posted with the hold are patient (the other node naps over them): tell it
  // they are about to fill (a vectored half's first, its piece list or go, below).
  const bool known = started && offer->list_known;  // It kept the list from a move before.
  side.wake = started && (pieces == nullptr || (known && push));
  side.progress = control.Reporter();
  side.list_serial = pieces != nullptr ? pieces->serial : 0;
  // A vectored move: each side's pieces in list order. The other node's go as a message
  // of their own, the move's first.
  const bool list_message = pieces != nullptr;
  std::vector<uint64_t> theirs;  // {offset, length} pairs.
  if (pieces != nullptr) {
    const size_t n = pieces->list.size();
    auto ours = std::make_shared<std::vector<Segment>>(n);
    if (!known) theirs.resize(2 * n);  // Known: the other node has its pieces already.
    Segment* o = ours->data();
    const Segment* in = pieces->list.data();
    for (size_t i = 0; i < n; ++i) {
      const uint64_t here = push ? in[i].src : in[i].dst;
      o[i] = Segment{here, here, in[i].length};
    }
    for (size_t i = 0; i < theirs.size() / 2; ++i) {
      theirs[2 * i] = push ? in[i].dst : in[i].src;
      theirs[2 * i + 1] = in[i].length;
    }
    side.pieces = std::move(ours);
  }
  bool busy_there = false;  // StartMpi found no bounce ring free on the other node.
  auto start_half = [&](bool send) {
    const absl::Time t = absl::Now();
    absl::Status st;
    if (known && !send) {
      // A receiving half with its pieces known posted its receives with the hold (Send
      // wakes it).
    } else if (started) {
      mpi_->Wake(side.peer, side.tag);  // It waits for its list or go patiently.
      if (known) st = SendGo(side.peer, side.tag);
    } else {
      st = StartMpi(*remote_, hold, mpi_->world().rank, side.tag, side.chunk, send,
                    pieces != nullptr ? pieces->list.size() : 0);
      busy_there = absl::IsResourceExhausted(st);
    }
    const absl::Time called = absl::Now();
    if (st.ok() && list_message && !known) st = SendPieceList(theirs, side.peer, side.tag);
    VLOG(2) << "StartMpi of transfer " << hold.transfer_id << " at node " << hold.node << " ("
            << (pieces != nullptr ? pieces->list.size() : 0) << " pieces"
            << (list_message ? (known ? " known there" : " to follow") : "") << "): "
            << (started ? std::string("started with the hold")
                        : absl::StrCat(absl::ToDoubleMicroseconds(called - t), " us"))
            << (list_message ? absl::StrCat(", its piece list sent in ",
                                            absl::ToDoubleMicroseconds(absl::Now() - called), " us")
                             : "");
    return st;
  };
  // Our bounce ring first, waiting while other moves use the pool, and only then the
  // other node's half (which takes its own ring as it starts): a runner never has more
  // halves waiting on the other node than it has rings to feed them.
  auto attempt = [&]() -> absl::Status {
    std::optional<BounceRing> ring;
    side.ring = nullptr;
    if (Staged(side.local)) {
      auto taken = BounceRing::TakeWaiting(pinned_, RingFor(side),
                                           absl::Now() + BounceRing::kWait,
                                           [&control] { return control.cancelled(); });
      if (!taken.ok()) return taken.status();
      side.ring = &ring.emplace(*std::move(taken));
    }
    if (push) {
      // The destination posts its receives before we send (with the hold, or now); a
      // vectored half started with the hold gets its list first.
      if (!started || pieces != nullptr) {
        absl::Status st = start_half(/*send=*/false);
        if (!st.ok()) return st;
      }
      return Send(side);
    }
    absl::Status st = Receive(
        side, [&] { return start_half(/*send=*/true); },
        [&] { StopMpi(*remote_, hold).IgnoreError(); });
    if (IsSenderStopped(st)) {
      return absl::AbortedError(
          absl::StrCat("node ", hold.node, " stopped sending before the end (see its log)"));
    }
    return st;
  };
  // The other node's half waits only briefly for a ring of its own (kHalfRingWait) and
  // fails its StartMpi before a byte moves when none came free: then this side gives its
  // ring back, pauses and starts again, until BounceRing::kWait. A runner does not sit on
  // its ring while the other node's are all held (two nodes whose runners push at each
  // other with full pools would otherwise wait on each other), and a half that is slow to
  // give its ring back (a loaded machine) costs a pause, not the move.
  const absl::Time give_up = absl::Now() + BounceRing::kWait;
  absl::BitGen jitter;
  for (absl::Duration pause = absl::Milliseconds(2);;
       pause = std::min(2 * pause, absl::Milliseconds(100))) {
    busy_there = false;
    absl::Status st = attempt();
    if (!busy_there || control.cancelled() || absl::Now() + pause > give_up) return st;
    VLOG(1) << "MPI move of transfer " << hold.transfer_id << ": node " << hold.node
            << " had no bounce ring free (" << st << "); starting again";
    absl::SleepFor(pause * absl::Uniform(jitter, 0.5, 1.5));
    side.tag = NextTag();  // Nothing of the last try can match this one's messages.
  }
}

void MpiEngine::PrepareAsk(RemoteAsk& ask) {
  // Whole-range pulls start the sender once our receives are posted (StartMpi). A
  // vectored move's half, either way, starts with the hold and waits for its pieces,
  // which the runner sends as the move's first message once it is ready (where the
  // holder can: MpiCodec::EncodeAsk).
  if (ask.vectored && (ask.piece_count == 0 || ask.piece_count > kMaxHalfPieces)) return;
  if (!ask.write && !ask.vectored) return;
  auto mpi = std::make_shared<MpiAsk>();
  mpi->tag = NextTag();
  mpi->chunk = ChunkFor(ask.local_device, ask.vectored);
  mpi->piece_count = ask.vectored ? ask.piece_count : 0;
  mpi->list_key = ask.vectored ? ask.list_serial : 0;
  ask.path_ask = std::move(mpi);
}

void MpiEngine::Abandon(const RemoteHold& hold) {
  const MpiOffer* offer = hold.offer<MpiOffer>();
  // A half started with the hold waits for data (a push) or its piece list (a vectored
  // move): an empty message under its tag tells it the move will not run.
  if (offer == nullptr || offer->started_tag == 0) return;
  auto r = mpi_->Wait(mpi_->Isend(nullptr, 0, offer->rank, offer->started_tag));
  if (!r.ok()) {
    LOG(WARNING) << "telling rank " << offer->rank << " that transfer " << hold.transfer_id
                 << " will not run: " << r.status();
  }
}

absl::StatusOr<const BounceRing*> MpiEngine::RingOf(const Side& side,
                                                    std::optional<BounceRing>& own) {
  if (side.ring != nullptr) return side.ring;
  auto taken = BounceRing::TakeWaiting(pinned_, RingFor(side), absl::Now() + kHalfRingWait,
                                       [&side] { return !side.progress(0); });
  if (!taken.ok()) return taken.status();
  return &own.emplace(*std::move(taken));
}

absl::Status MpiEngine::Send(const Side& side) {
  if (side.wake) mpi_->Wake(side.peer, side.tag);
  uint64_t sent = 0;  // Bytes whose sends completed.
  bool stopped = false;
  bool wire_failed = false;
  absl::Status st;
  if (side.pieces != nullptr) {
    st = SendPieces(side, &wire_failed, &sent);
  } else if (Staged(side.local)) {
    std::optional<BounceRing> own;
    absl::StatusOr<const BounceRing*> ring = RingOf(side, own);
    if (!ring.ok()) {
      st = ring.status();
    } else {
      st = StageOut(
          gpu_, side.local.data, side.local.device, side.length, **ring,
          [&](const char* host, uint64_t offset, uint64_t n) -> absl::Status {
            auto r = mpi_->Wait(mpi_->Isend(host, n, side.peer, side.tag));
            if (!r.ok()) {
              wire_failed = true;
              return r.status();
            }
            sent = offset + n;
            return absl::OkStatus();
          },
          [&](uint64_t done) {
            if (!side.progress(done)) stopped = true;
            return !stopped;
          });
    }
  } else {
    // Unstaged: a window of sends straight from the range.
    std::deque<std::pair<std::shared_ptr<MpiTransport::Op>, uint64_t>> in_flight;
    uint64_t next = 0;
    while (true) {
      while (!stopped && next < side.length &&
             in_flight.size() < static_cast<size_t>(options_.window)) {
        const uint64_t n = std::min(side.chunk, side.length - next);
        in_flight.emplace_back(mpi_->Isend(side.local.data + next, n, side.peer, side.tag),
                               next + n);
        next += n;
      }
      if (in_flight.empty()) break;
      auto r = mpi_->Wait(in_flight.front().first);
      if (!r.ok()) {
        // The peer is gone or MPI failed: the rest are abandoned to the library.
        wire_failed = true;
        st = r.status();
        break;
      }
      sent = in_flight.front().second;
      in_flight.pop_front();
      if (!stopped && !side.progress(sent) && next < side.length) stopped = true;
    }
    if (st.ok() && stopped) st = absl::CancelledError("cancelled");
  }
  if (st.ok() || wire_failed || sent >= side.length) return st;
  // Stopped early with the wire intact: tell the receiver no more is coming.
  auto r = mpi_->Wait(mpi_->Isend(nullptr, 0, side.peer, side.tag));
  if (!r.ok()) return r.status();
  return st;
}

absl::Status MpiEngine::Receive(const Side& side, const std::function<absl::Status()>& posted,
                                const std::function<void()>& ask_stop) {
  bool stop_asked = false;
  auto progress = [&](uint64_t done) {
    if (!stop_asked && !side.progress(done)) {
      stop_asked = true;
      ask_stop();
    }
    return true;  // Keep receiving until the sender says it stopped.
  };
  absl::Status st;
  if (side.pieces != nullptr) {
    st = ReceivePieces(side, posted, progress);
  } else if (Staged(side.local)) {
    std::optional<BounceRing> own;
    absl::StatusOr<const BounceRing*> ring = RingOf(side, own);
    if (!ring.ok()) return ring.status();
    // The staging pipeline posts each receive when its bounce slot is free; MPI matches a
    // send that arrives first when the receive is posted.
    if (absl::Status s = posted(); !s.ok()) return s;
    st = StageIn(
        gpu_, side.local.data, side.local.device, side.length, **ring,
        [&](char* host, uint64_t offset, uint64_t n) -> absl::Status {
          auto r =
              mpi_->Wait(mpi_->Irecv(host, n, side.peer, side.tag, side.patient && offset == 0));
          if (!r.ok()) return r.status();
          if (*r == 0) return absl::AbortedError(kSenderStopped);
          if (*r != n) {
            return absl::DataLossError(
                absl::StrCat("chunk at ", offset, ": ", *r, " bytes came, ", n, " expected"));
          }
          return absl::OkStatus();
        },
        progress);
  } else {
    std::deque<std::pair<std::shared_ptr<MpiTransport::Op>, uint64_t>> in_flight;
    uint64_t next = 0;
    uint64_t done = 0;
    auto post = [&] {
      while (next < side.length && in_flight.size() < static_cast<size_t>(options_.window)) {
        const uint64_t n = std::min(side.chunk, side.length - next);
        in_flight.emplace_back(
            mpi_->Irecv(side.local.data + next, n, side.peer, side.tag, side.patient && done == 0),
            n);
        next += n;
      }
    };
    post();
    auto cancel_rest = [&] {
      std::vector<std::shared_ptr<MpiTransport::Op>> rest;
      for (auto& [op, unused] : in_flight) rest.push_back(op);
      mpi_->CancelReceives(rest);
    };
    if (absl::Status s = posted(); !s.ok()) {
      cancel_rest();
      return s;
    }
    while (!in_flight.empty()) {
      auto [op, n] = in_flight.front();
      in_flight.pop_front();
      auto r = mpi_->Wait(op);
      if (!r.ok()) {
        st = r.status();
      } else if (*r == 0) {
        st = absl::AbortedError(kSenderStopped);
      } else if (*r != n) {
        st = absl::DataLossError(
            absl::StrCat("chunk at ", done, ": ", *r, " bytes came, ", n, " expected"));
      }
      if (!st.ok()) {
        cancel_rest();
        break;
      }
      done += n;
      progress(done);
      post();
    }
  }
  if (IsSenderStopped(st) && stop_asked) return absl::CancelledError("cancelled");
  return st;
}

}  // namespace gpumove
