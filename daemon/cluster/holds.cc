#include "daemon/cluster/holds.h"

#include "absl/strings/str_cat.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"

namespace gpumove {
namespace {

HoldTable::Slots SlotsOf(const BounceRing& ring) {
  HoldTable::Slots out;
  out.slot_size = ring.chunk();
  for (size_t i = 0; i < ring.slots(); ++i) out.slots.push_back(ring.slot(i));
  return out;
}

}  // namespace

absl::StatusOr<HoldTable::Held> HoldTable::Hold(const std::string& from_node,
                                                uint64_t from_incarnation,
                                                const std::string& transfer_id,
                                                const std::string& owner,
                                                const std::string& buffer_id, uint64_t offset,
                                                uint64_t length, bool may_stage) {
  auto use = registry_->Acquire(owner, buffer_id, offset, length);
  if (!use.ok()) return use.status();
  auto entry = std::make_shared<Entry>();
  entry->incarnation = from_incarnation;
  uint64_t slot_size = 0;
  if (may_stage && (staging_.all || (staging_.device && use->kind() == MemoryKind::kDevice))) {
    const StagingOptions sized = SizedFor(staging_.options, use->length());
    auto ring = BounceRing::Take(staging_.pinned, sized);
    if (ring.ok()) {
      entry->ring.emplace(*std::move(ring));
    } else if (absl::IsResourceExhausted(ring.status()) &&
               BounceRing::CouldFit(staging_.pinned, sized)) {
      // Busy, not too small: the runner takes the ring when the move runs (holds for a
      // whole Submit are made at once, but its moves run a few at a time).
      entry->stage_later = true;
      slot_size = sized.chunk;
    } else {
      return ring.status();
    }
  }
  entry->use = *std::move(use);
  Held held;
  held.data = entry->use.data();
  held.length = entry->use.length();
  held.kind = entry->use.kind();
  held.device = entry->use.device();
  if (entry->ring.has_value()) held.ring = SlotsOf(*entry->ring);
  held.stage_later = entry->stage_later;
  held.stage_slot_size = slot_size;
  const std::string key = absl::StrCat(from_node, "\n", transfer_id);
  absl::MutexLock lock(&mu_);
  auto& slot = holds_[key];
  if (slot != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat("transfer ", Quoted(transfer_id), " already holds a range"));
  }
  slot = std::move(entry);
  if (held.stage_later) ++deferred_;
  return held;
}

absl::StatusOr<HoldTable::Slots> HoldTable::TakeRing(const std::string& from_node,
                                                      const std::string& transfer_id) {
  absl::MutexLock lock(&mu_);
  auto it = holds_.find(absl::StrCat(from_node, "\n", transfer_id));
  if (it == holds_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no hold for transfer ", Quoted(transfer_id), " from ", Quoted(from_node)));
  }
  Entry& e = *it->second;
  if (e.ring.has_value()) return SlotsOf(*e.ring);
  if (!e.stage_later) return absl::FailedPreconditionError("this range is not staged");
  auto ring = BounceRing::Take(staging_.pinned, SizedFor(staging_.options, e.use.length()));
  if (!ring.ok()) return ring.status();
  e.ring.emplace(*std::move(ring));
  return SlotsOf(*e.ring);
}

absl::Status HoldTable::StageChunk(const std::string& from_node, const std::string& transfer_id,
                                   uint32_t slot, uint64_t slot_offset, uint64_t offset,
                                   uint64_t length, bool to_range) {
  std::shared_ptr<Entry> entry;
  const BounceRing* taken = nullptr;  // Entry::ring is set once, under the lock.
  {
    absl::MutexLock lock(&mu_);
    auto it = holds_.find(absl::StrCat(from_node, "\n", transfer_id));
    if (it == holds_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no hold for transfer ", Quoted(transfer_id), " from ", Quoted(from_node)));
    }
    entry = it->second;
    if (entry->ring.has_value()) taken = &*entry->ring;
  }
  if (taken == nullptr) {
    return absl::FailedPreconditionError(entry->stage_later
                                             ? "no bounce slots taken for this range yet"
                                             : "this range is not staged");
  }
  const BounceRing& ring = *taken;
  uint64_t end = 0;
  if (slot >= ring.slots() || slot_offset > ring.chunk() || length > ring.chunk() - slot_offset ||
      __builtin_add_overflow(offset, length, &end) || end > entry->use.length()) {
    return absl::InvalidArgumentError("stage chunk outside the slot or the held range");
  }
  char* bounce = ring.slot(slot) + slot_offset;
  const int device = entry->use.kind() == MemoryKind::kDevice ? entry->use.device() : kHostDevice;
  char* range = entry->use.data() + offset;
  return to_range ? staging_.gpu->Copy(range, device, bounce, kHostDevice, length, length, nullptr)
                  : staging_.gpu->Copy(bounce, kHostDevice, range, device, length, length, nullptr);
}

absl::Status HoldTable::StartHalf(const std::string& from_node, const std::string& transfer_id,
                                  const HalfStarter& start) {
  // Under the lock, so that a concurrent release cannot drop the range meanwhile; starting
  // only posts the first receives.
  absl::MutexLock lock(&mu_);
  auto it = holds_.find(absl::StrCat(from_node, "\n", transfer_id));
  if (it == holds_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no hold for transfer ", Quoted(transfer_id), " from ", Quoted(from_node)));
  }
  if (it->second->half != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat("transfer ", Quoted(transfer_id), " already started"));
  }
  auto half = start(it->second->use);
  if (!half.ok()) return half.status();
  it->second->half = *std::move(half);
  return absl::OkStatus();
}

absl::Status HoldTable::StopHalf(const std::string& from_node, const std::string& transfer_id) {
  absl::MutexLock lock(&mu_);
  auto it = holds_.find(absl::StrCat(from_node, "\n", transfer_id));
  if (it == holds_.end() || it->second->half == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no running half for transfer ", Quoted(transfer_id), " from ", Quoted(from_node)));
  }
  it->second->half->Stop();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> HoldTable::Complete(const std::string& from_node,
                                             const std::string& transfer_id, bool checksum,
                                             bool runner_ok, absl::Duration half_wait,
                                             const AckFence& fence, absl::Duration fence_wait) {
  const absl::Time arrived = absl::Now();
  std::shared_ptr<Entry> entry;
  {
    absl::MutexLock lock(&mu_);
    auto it = holds_.find(absl::StrCat(from_node, "\n", transfer_id));
    if (it == holds_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no hold for transfer ", Quoted(transfer_id), " from ", Quoted(from_node)));
    }
    entry = std::move(it->second);
    holds_.erase(it);
  }
  if (entry->half != nullptr) {
    if (!runner_ok) entry->half->Stop();
    absl::Status st = entry->half->Wait(absl::Now() + half_wait);
    if (!st.ok() && runner_ok) {
      return absl::Status(st.code(), absl::StrCat("this node's half of the move: ", st.message()));
    }
  }
  const BufferUse& u = entry->use;
  if (runner_ok && !fence.handle.empty()) {
    const absl::Time quiet_until =
        staging_.fence_quiet_rate == 0 || fence.bytes == 0
            ? absl::InfinitePast()
            : arrived + absl::Seconds(static_cast<double>(std::min(fence.bytes, u.length())) /
                                      static_cast<double>(staging_.fence_quiet_rate));
    GpuRuntime* gpu = staging_.gpu;
    if (gpu == nullptr || gpu->devices().empty()) {
      return absl::FailedPreconditionError(
          "waiting for the runner's copy to end: this node has no GPU to wait for it with");
    }
    const int device = u.kind() == MemoryKind::kDevice ? u.device() : gpu->devices().front().index;
    absl::Status st;
    if (fence.runner_waits && !checksum) {
      // One look, which also refuses a handle the driver will not open: a copy still
      // running is acknowledged now (the runner sees it end itself) and its hold ends
      // when this node sees it end too.
      st = gpu->WaitIpcFence(device, fence.handle, absl::InfinitePast());
      if (absl::IsDeadlineExceeded(st)) {
        entry->use.MarkEnding();
        EndLater(Ending{std::move(entry),
                        absl::StrCat("transfer ", transfer_id, " from ", from_node),
                        FenceWait{device, fence.handle, quiet_until, arrived + fence_wait}});
        return 0;
      }
    } else {
      st = gpu->WaitIpcFence(device, fence.handle, absl::Now() + fence_wait, quiet_until);
    }
    if (!st.ok()) {
      return absl::Status(st.code(),
                          absl::StrCat("waiting for the runner's copy to end: ", st.message()));
    }
  }
  if (!checksum) return 0;
  return hasher_(Endpoint{u.data(), u.kind(), u.device()}, u.length());
}

bool HoldTable::AnswersFenceAtOnce(const AckFence& fence, bool checksum) const {
  return fence.runner_waits && !checksum && staging_.gpu != nullptr &&
         staging_.gpu->KnowsIpcFence(fence.handle);
}

bool HoldTable::HasHalf(const std::string& from_node, const std::string& transfer_id) const {
  absl::MutexLock lock(&mu_);
  auto it = holds_.find(absl::StrCat(from_node, "\n", transfer_id));
  return it != holds_.end() && it->second->half != nullptr;
}

int HoldTable::ReleaseFrom(const std::string& node, uint64_t incarnation) {
  std::vector<std::shared_ptr<Entry>> dropped;
  {
    absl::MutexLock lock(&mu_);
    const std::string prefix = absl::StrCat(node, "\n");
    for (auto it = holds_.begin(); it != holds_.end();) {
      if (it->first.rfind(prefix, 0) == 0 && it->second->incarnation == incarnation) {
        dropped.push_back(std::move(it->second));
        holds_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  if (!dropped.empty()) {
    LOG(WARNING) << "released " << dropped.size() << " range(s) held for moves run by " << node;
  }
  return static_cast<int>(dropped.size());
}

size_t HoldTable::size() const {
  absl::MutexLock lock(&mu_);
  return holds_.size() + ending_.size();
}

void HoldTable::EndLater(Ending ending) {
  absl::MutexLock lock(&mu_);
  ending_.push_back(std::move(ending));
  if (!ender_.joinable()) ender_ = std::thread([this] { EndLoop(); });
}

void HoldTable::EndLoop() {
  while (true) {
    FenceWait wait;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !ending_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (ending_.empty()) return;  // Stopping, every hold ended.
      wait = ending_.front().wait;  // Left in the queue meanwhile, so size() counts it.
    }
    const absl::Status st =
        staging_.gpu->WaitIpcFence(wait.device, wait.fence, wait.deadline, wait.quiet_until);
    Ending e;
    absl::MutexLock lock(&mu_);
    e = std::move(ending_.front());
    ending_.pop_front();
    if (!st.ok()) {
      // The runner saw its own copy end or fail: this node only lets the range go.
      LOG(WARNING) << "the hold of " << e.what
                   << " ends without this node seeing the runner's copy end: " << st;
    }
    // e.entry goes when `e` does, after the lock (ending the use takes the registry's).
  }
}

HoldTable::~HoldTable() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (ender_.joinable()) ender_.join();
}

}  // namespace gpumove
