#include "daemon/path/mpi/mpi_engine.h"

#include <bit>
#include <cstdlib>
#include <deque>
#include <optional>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "daemon/common/log.h"

namespace gpumove {
namespace {

// A receive that got the sender's zero-byte "stopped" message.
constexpr absl::string_view kSenderStopped = "the sender stopped before the end";

bool IsSenderStopped(const absl::Status& s) {
  return s.code() == absl::StatusCode::kAborted && s.message() == kSenderStopped;
}

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

struct MpiEngine::Slots {
  std::optional<BounceRing> ring;  // Staged: the ring's slots (when not the caller's).
  std::vector<Scratch> scratch;    // Else: scratch buffers.
  std::vector<char*> at;
  int device = kHostDevice;  // Where the slots are.
  // MPI may still read or write them (the wire failed with operations in flight): they
  // are not used again.
  bool abandoned = false;
};

void MpiEngine::Free(const Scratch& s) {
  if (s.device == kHostDevice) {
    std::free(s.data);
  } else {
    gpu_->DeviceFree(s.device, s.data);
  }
}

MpiEngine::~MpiEngine() {
  absl::MutexLock lock(&scratch_mu_);
  for (const Scratch& s : scratch_) Free(s);
}

absl::StatusOr<std::unique_ptr<MpiEngine::Slots>> MpiEngine::SlotsFor(const Side& side) {
  auto slots = std::make_unique<Slots>();
  if (Staged(side.local)) {
    absl::StatusOr<const BounceRing*> ring = RingOf(side, slots->ring);
    if (!ring.ok()) return ring.status();
    for (size_t i = 0; i < (*ring)->slots(); ++i) slots->at.push_back((*ring)->slot(i));
    return slots;
  }
  const int device = side.local.kind == MemoryKind::kDevice ? side.local.device : kHostDevice;
  slots->device = device;
  const uint64_t messages = (side.length + side.chunk - 1) / side.chunk;
  const int most =
      device == kHostDevice ? options_.window : std::min(options_.window, kDeviceScratchSlots);
  const size_t want = std::clamp<uint64_t>(messages, 1, std::max(most, 1));
  {
    absl::MutexLock lock(&scratch_mu_);
    for (auto it = scratch_.begin(); it != scratch_.end() && slots->scratch.size() < want;) {
      if (it->device == device && it->bytes == side.chunk) {
        slots->scratch.push_back(*it);
        it = scratch_.erase(it);
      } else {
        ++it;
      }
    }
  }
  while (slots->scratch.size() < want) {
    char* data = nullptr;
    if (device == kHostDevice) {
      data = static_cast<char*>(std::aligned_alloc(4096, (side.chunk + 4095) / 4096 * 4096));
    } else {
      absl::StatusOr<void*> d = gpu_->DeviceAlloc(device, side.chunk);
      if (d.ok()) data = static_cast<char*>(*d);
    }
    if (data == nullptr) {
      GiveBack(*slots);
      return absl::ResourceExhaustedError(absl::StrCat(
          "no room for ", want, " message slots of ", side.chunk, " bytes on ",
          device == kHostDevice ? std::string("the host") : absl::StrCat("GPU ", device)));
    }
    slots->scratch.push_back(Scratch{device, side.chunk, data});
  }
  for (const Scratch& s : slots->scratch) slots->at.push_back(s.data);
  return slots;
}

void MpiEngine::GiveBack(Slots& slots) {
  if (slots.abandoned) {
    LOG(WARNING) << "left " << slots.scratch.size()
                 << " MPI message slots to the library (operations on them never ended)";
    slots.scratch.clear();
    return;
  }
  std::vector<Scratch> extra;
  {
    absl::MutexLock lock(&scratch_mu_);
    for (const Scratch& s : slots.scratch) {
      if (scratch_.size() < kKeptScratch) {
        scratch_.push_back(s);
      } else {
        extra.push_back(s);
      }
    }
  }
  for (const Scratch& s : extra) Free(s);
  slots.scratch.clear();
}

MpiEngine::MessagePlan MpiEngine::PlanMessages(const std::vector<Segment>& pieces, uint64_t chunk) {
  MessagePlan plan;
  plan.parts.reserve(pieces.size() + 1);
  uint64_t filled = 0;  // Bytes in the message being planned.
  for (const Segment& p : pieces) {
    for (uint64_t at = p.src, left = p.length; left > 0;) {
      const uint64_t n = std::min(left, chunk - filled);
      plan.parts.push_back(Segment{at, filled, n});
      at += n;
      left -= n;
      filled += n;
      if (filled == chunk) {
        plan.begin.push_back(plan.parts.size());
        filled = 0;
      }
    }
  }
  if (filled > 0) plan.begin.push_back(plan.parts.size());
  return plan;
}

bool MpiEngine::Typed(const Side& side) const {
  if (side.pieces == nullptr || side.pieces->empty() || Staged(side.local)) return false;
  switch (options_.datatypes) {
    case MpiEngineOptions::Datatypes::kNever:
      return false;
    case MpiEngineOptions::Datatypes::kAlways:
      return true;
    case MpiEngineOptions::Datatypes::kAuto:
      return side.local.kind != MemoryKind::kDevice &&
             mpi_->world().local_size == mpi_->world().size;
  }
  return false;
}

MpiParts MpiEngine::PartsOf(const MessagePlan& plan, size_t k) {
  MpiParts m;
  const size_t b = plan.begin[k], e = plan.begin[k + 1];
  m.at.resize(e - b);
  m.lengths.resize(e - b);
  for (size_t i = b; i < e; ++i) {
    m.at[i - b] = static_cast<int64_t>(plan.parts[i].src);
    m.lengths[i - b] = static_cast<int>(plan.parts[i].length);  // At most a message.
  }
  return m;
}

absl::StatusOr<MpiEngine::Packing> MpiEngine::StartPacking(const Side& side) {
  Packing p;
  p.typed = Typed(side);
  if (p.typed) {
    p.window = static_cast<size_t>(std::max(1, options_.window));
  } else {
    auto slots = SlotsFor(side);
    if (!slots.ok()) return slots.status();
    p.slots = *std::move(slots);
    p.window = p.slots->at.size();
  }
  p.plan = PlanMessages(*side.pieces, side.chunk);
  // A message that is one piece's bytes goes from or into the range itself where MPI
  // takes it.
  p.direct_ok = !Staged(side.local);
  return p;
}

uint64_t MpiEngine::MessageKey(uint64_t list_serial, uint64_t chunk, size_t k, bool pack) {
  if (list_serial == 0) return 0;
  auto mix = [](uint64_t x) {  // splitmix64's finalizer.
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  uint64_t h = mix(list_serial);
  h = mix(h ^ chunk);
  h = mix(h ^ ((uint64_t{k} << 1) | (pack ? 1 : 0)));
  return h | (uint64_t{1} << 63);
}

absl::Status MpiEngine::CopyMessage(const Side& side, const Slots& slots, char* slot,
                                    const std::vector<Segment>& parts, size_t begin, size_t end,
                                    uint64_t bytes, bool pack, size_t k) {
  const int local_device = side.local.kind == MemoryKind::kDevice ? side.local.device : kHostDevice;
  // Packing copies parts as they are (local -> slot); unpacking the other way round.
  thread_local std::vector<Segment> swapped;
  const std::vector<Segment>* list = &parts;
  if (!pack) {
    swapped.assign(parts.begin() + begin, parts.begin() + end);
    for (Segment& p : swapped) std::swap(p.src, p.dst);
    list = &swapped;
    end -= begin;
    begin = 0;
  }
  char* dst = pack ? slot : side.local.data;
  const char* src = pack ? side.local.data : slot;
  const int dst_device = pack ? slots.device : local_device;
  const int src_device = pack ? local_device : slots.device;
  if (dst_device == kHostDevice && src_device == kHostDevice) {
    CopyPieces(dst, src, *list, begin, end, bytes, kCopyThreads);
    return absl::OkStatus();
  }
  return gpu_->CopyPieces(dst, dst_device, src, src_device, list->data() + begin, end - begin,
                          bytes, nullptr, MessageKey(side.list_serial, side.chunk, k, pack));
}

absl::Status MpiEngine::SendPieces(const Side& side, bool* wire_failed, uint64_t* sent) {
  auto packing = StartPacking(side);
  if (!packing.ok()) return packing.status();
  absl::Cleanup give_back = [&] {
    if (packing->slots != nullptr) GiveBack(*packing->slots);
  };
  Slots* const slots = packing->slots.get();  // Null: typed.
  const MessagePlan& plan = packing->plan;
  const size_t window = packing->window;
  const bool direct_ok = packing->direct_ok;
  const bool typed = packing->typed;
  auto abandon = [slots] {
    if (slots != nullptr) slots->abandoned = true;
  };
  struct Sending {
    std::shared_ptr<MpiTransport::Op> op;
    uint64_t end;
  };
  std::deque<Sending> in_flight;
  absl::Status st;
  bool stopped = false;
  // --v=2: where a vectored send's time goes (packing, waiting for sends).
  const absl::Time began = absl::Now();
  absl::Duration pack_time, waiting;
  absl::Cleanup trace = [&] {
    VLOG(2) << "MPI vectored send to rank " << side.peer << ": " << plan.messages()
            << (typed ? " derived-datatype" : "") << " messages of " << plan.parts.size()
            << " parts in " << absl::ToDoubleMicroseconds(absl::Now() - began) << " us; packing "
            << absl::ToDoubleMicroseconds(pack_time) << " us, waits "
            << absl::ToDoubleMicroseconds(waiting) << " us";
  };
  for (size_t k = 0; k < plan.messages(); ++k) {
    if (in_flight.size() == window) {
      const absl::Time t = absl::Now();
      auto r = mpi_->Wait(in_flight.front().op);
      waiting += absl::Now() - t;
      if (!r.ok()) {
        *wire_failed = true;
        abandon();
        return r.status();
      }
      *sent = in_flight.front().end;
      in_flight.pop_front();
      if (!side.progress(*sent)) {
        stopped = true;
        break;
      }
    }
    const size_t b = plan.begin[k], e = plan.begin[k + 1];
    const uint64_t at = k * side.chunk;
    const uint64_t n = std::min(side.chunk, side.length - at);
    if (typed && e - b > 1) {
      in_flight.push_back(Sending{
          mpi_->IsendParts(side.local.data, PartsOf(plan, k), side.peer, side.tag), at + n});
      continue;
    }
    const char* data = nullptr;
    if (direct_ok && e - b == 1) {
      data = side.local.data + plan.parts[b].src;
    } else {
      char* slot = slots->at[k % window];
      const absl::Time t = absl::Now();
      st = CopyMessage(side, *slots, slot, plan.parts, b, e, n, /*pack=*/true, k);
      pack_time += absl::Now() - t;
      if (!st.ok()) break;
      data = slot;
    }
    in_flight.push_back(Sending{mpi_->Isend(data, n, side.peer, side.tag), at + n});
  }
  while (!in_flight.empty()) {
    const absl::Time t = absl::Now();
    auto r = mpi_->Wait(in_flight.front().op);
    waiting += absl::Now() - t;
    if (!r.ok()) {
      *wire_failed = true;
      abandon();
      return r.status();
    }
    *sent = in_flight.front().end;
    in_flight.pop_front();
    if (!stopped && st.ok() && !side.progress(*sent) && *sent < side.length) stopped = true;
  }
  if (st.ok() && stopped && *sent < side.length) st = absl::CancelledError("cancelled");
  return st;
}

absl::Status MpiEngine::ReceivePieces(const Side& side, const std::function<absl::Status()>& posted,
                                      const std::function<bool(uint64_t)>& progress) {
  auto packing = StartPacking(side);
  if (!packing.ok()) return packing.status();
  absl::Cleanup give_back = [&] {
    if (packing->slots != nullptr) GiveBack(*packing->slots);
  };
  Slots* const slots = packing->slots.get();  // Null: typed.
  const MessagePlan& plan = packing->plan;
  const size_t window = packing->window;
  const bool direct_ok = packing->direct_ok;
  const bool typed = packing->typed;
  std::deque<std::pair<std::shared_ptr<MpiTransport::Op>, size_t>> in_flight;  // Message k.
  size_t next = 0;
  auto single = [&](size_t k) { return plan.begin[k + 1] - plan.begin[k] == 1; };
  // Received where its bytes belong: one piece's, or a typed message's.
  auto is_direct = [&](size_t k) { return typed || (direct_ok && single(k)); };
  auto bytes_of = [&](size_t k) { return std::min(side.chunk, side.length - k * side.chunk); };
  auto post = [&] {
    while (next < plan.messages() && in_flight.size() < window) {
      const bool patient = side.patient && next == 0;
      if (typed && !single(next)) {
        in_flight.emplace_back(
            mpi_->IrecvParts(side.local.data, PartsOf(plan, next), side.peer, side.tag, patient),
            next);
      } else {
        char* into = is_direct(next) ? side.local.data + plan.parts[plan.begin[next]].src
                                     : slots->at[next % window];
        in_flight.emplace_back(mpi_->Irecv(into, bytes_of(next), side.peer, side.tag, patient),
                               next);
      }
      ++next;
    }
  };
  auto cancel_rest = [&] {
    std::vector<std::shared_ptr<MpiTransport::Op>> rest;
    for (auto& [op, unused] : in_flight) rest.push_back(op);
    mpi_->CancelReceives(rest);
    in_flight.clear();
  };
  post();
  if (absl::Status s = posted(); !s.ok()) {
    cancel_rest();
    return s;
  }
  absl::Status st;
  uint64_t done = 0;
  // --v=2: where a vectored receive's time goes (waiting for messages, unpacking).
  const absl::Time began = absl::Now();
  absl::Duration unpacking, waiting;
  absl::Cleanup trace = [&] {
    VLOG(2) << "MPI vectored receive from rank " << side.peer << ": " << plan.messages()
            << (typed ? " derived-datatype" : "") << " messages of " << plan.parts.size()
            << " parts in " << absl::ToDoubleMicroseconds(absl::Now() - began) << " us; waits "
            << absl::ToDoubleMicroseconds(waiting) << " us, unpacking "
            << absl::ToDoubleMicroseconds(unpacking) << " us";
  };
  while (!in_flight.empty()) {
    auto [op, k] = in_flight.front();
    in_flight.pop_front();
    const uint64_t n = bytes_of(k);
    const absl::Time t = absl::Now();
    auto r = mpi_->Wait(op);
    waiting += absl::Now() - t;
    if (!r.ok()) {
      st = r.status();
      if (slots != nullptr) slots->abandoned = true;  // Receives cancelled by then, not surely.
    } else if (*r == 0) {
      st = absl::AbortedError(kSenderStopped);
    } else if (*r != n) {
      st = absl::DataLossError(
          absl::StrCat("message ", k, ": ", *r, " bytes came, ", n, " expected"));
    } else if (!is_direct(k)) {
      const absl::Time u = absl::Now();
      st = CopyMessage(side, *slots, slots->at[k % window], plan.parts, plan.begin[k],
                       plan.begin[k + 1], n, /*pack=*/false, k);
      unpacking += absl::Now() - u;
    }
    if (!st.ok()) {
      cancel_rest();
      break;
    }
    done += n;
    progress(done);
    post();
  }
  return st;
}

absl::Status MpiEngine::SendPieceList(const std::vector<uint64_t>& list, int peer, int tag) {
  auto r = mpi_->Wait(mpi_->Isend(list.data(), list.size() * sizeof(uint64_t), peer, tag));
  return r.status();
}

absl::Status MpiEngine::SendGo(int peer, int tag) {
  const uint64_t go = kGo;
  return mpi_->Wait(mpi_->Isend(&go, sizeof(go), peer, tag)).status();
}

absl::Status MpiEngine::ReceiveGo(int peer, int tag, bool patient,
                                  const std::function<void()>& posted) {
  uint64_t go = 0;
  auto op = mpi_->Irecv(&go, sizeof(go), peer, tag, patient);
  posted();
  auto r = mpi_->Wait(op);
  if (!r.ok()) return r.status();
  if (*r == 0) return absl::AbortedError(kSenderStopped);
  if (*r != sizeof(go) || go != kGo) {
    return absl::InvalidArgumentError(absl::StrCat("the go came as ", *r, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const std::vector<Segment>>> MpiEngine::ReceivePieceList(
    int peer, int tag, uint64_t count, uint64_t range, const std::function<void()>& posted,
    uint64_t* total, bool patient) {
  static_assert(std::endian::native == std::endian::little,
                "the list's integers are little-endian");
  std::vector<uint64_t> raw(2 * count);
  const uint64_t bytes = raw.size() * sizeof(uint64_t);
  auto op = mpi_->Irecv(raw.data(), bytes, peer, tag, patient);
  posted();
  auto r = mpi_->Wait(op);
  if (!r.ok()) return r.status();
  // An empty message: the move will not run (Abandon).
  if (*r == 0) return absl::AbortedError(kSenderStopped);
  if (*r != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the piece list came as ", *r, " bytes; ", count, " pieces are ", bytes));
  }
  auto pieces = std::make_shared<std::vector<Segment>>(count);
  Segment* out = pieces->data();
  for (uint64_t i = 0; i < count; ++i) out[i] = Segment{raw[2 * i], raw[2 * i], raw[2 * i + 1]};
  // Untrusted: every piece must lie in the range held.
  auto sum = CheckPiecesIn(*pieces, range, kMaxHalfPieces);
  if (!sum.ok()) return sum.status();
  *total = *sum;
  return pieces;
}

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
      st = StartMpi(*remote_, hold, side.tag, side.chunk, send,
                    pieces != nullptr ? pieces->list.size() : 0);
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
  std::optional<BounceRing> ring;
  if (Staged(side.local)) {
    auto taken = BounceRing::TakeWaiting(pinned_, RingFor(side), absl::Now() + BounceRing::kWait,
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
    return absl::InvalidArgumentError(absl::StrCat(listed, " pieces to come as a message (at most ",
                                                   kMaxHalfPieces, ")"));
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
    // The half ends before it moves a byte (its go or list did not come as they should).
    auto end_early = [&](const char* what, const absl::Status& st) {
      if (!IsSenderStopped(st)) {
        LOG(WARNING) << "MPI half for rank " << side.peer << ", tag " << side.tag << ": its "
                     << what << ": " << st;
      }
      p->status_ = st;
      notify_posted();
      p->done_.Notify();
    };
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
    if (!p->posted_.HasBeenNotified()) p->posted_.Notify();
    p->done_.Notify();
  });
  p->posted_.WaitForNotification();
  return half;
}

}  // namespace gpumove
