// MpiEngine's vectored messages: the slots a side packs messages in (bounce buffers or
// kept scratch buffers), the plan cutting pieces into messages, derived datatypes, the
// gather and scatter copies, and the send and receive loops over those messages.
#include <cstdlib>
#include <deque>
#include <optional>
#include <string>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/common/log.h"
#include "daemon/path/mpi/mpi_engine.h"
#include "daemon/path/mpi/mpi_sender_stopped.h"

namespace gpumove {

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

}  // namespace gpumove
