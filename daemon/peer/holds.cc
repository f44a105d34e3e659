#include "daemon/peer/holds.h"

#include "absl/strings/str_cat.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"
#include "daemon/common/status_macros.h"

namespace gpumove {

struct HoldTable::Entry {
  uint64_t incarnation = 0;
  // The move's notify bytes, and what its notification says.
  std::optional<std::string> notify;
  std::string owner, from_node, transfer_id;
  // A checksummed vectored move's pieces: the checksum is over them (else the range).
  std::shared_ptr<const Segments> pieces;
  BufferUse use;
  // After `use`: a part may use the range (an MPI half receiving into it), so it goes first.
  std::vector<std::unique_ptr<HoldPart>> parts;
};

const BufferUse& HoldTable::Ref::range() const { return entry_->use; }

std::vector<HoldPart*> HoldTable::Ref::parts() const {
  std::vector<HoldPart*> out;
  for (const auto& p : entry_->parts) out.push_back(p.get());
  return out;
}

namespace {

std::string Key(const std::string& from_node, const std::string& transfer_id) {
  return absl::StrCat(from_node, "\n", transfer_id);
}

absl::Status NoHold(const std::string& from_node, const std::string& transfer_id) {
  return absl::NotFoundError(
      absl::StrCat("no hold for transfer ", Quoted(transfer_id), " from ", Quoted(from_node)));
}

}  // namespace

absl::StatusOr<HoldTable::Held> HoldTable::Hold(
    const std::string& from_node, uint64_t from_incarnation, const std::string& transfer_id,
    const std::string& owner, const std::string& buffer_id, uint64_t offset, uint64_t length,
    const PartMaker& make, HoldAsk ask) {
  std::optional<std::string>& notify = ask.notify;
  if (notify.has_value() && notifications_ == nullptr) {
    return absl::FailedPreconditionError("this node publishes no notifications");
  }
  if (notify.has_value() && notify->size() > kMaxNotifyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("notify has ", notify->size(), " bytes; at most ", kMaxNotifyBytes));
  }
  if (!ask.pieces.empty() && piece_hasher_ == nullptr) {
    return absl::FailedPreconditionError("this node does not hash pieces of vectored moves");
  }
  {
    // A repeat is refused before its parts are made (they may start an MPI half).
    absl::MutexLock lock(&mu_);
    if (holds_.contains(Key(from_node, transfer_id))) {
      return absl::AlreadyExistsError(
          absl::StrCat("transfer ", Quoted(transfer_id), " already holds a range"));
    }
  }
  auto use = registry_->Acquire(owner, buffer_id, offset, length);
  if (!use.ok()) return use.status();
  if (!ask.pieces.empty()) {
    // Untrusted: every piece must lie in the range just held.
    auto checked = CheckPiecesIn(ask.pieces, use->length(), ask.pieces.size());
    if (!checked.ok()) return checked.status();
  }
  auto entry = std::make_shared<Entry>();
  entry->incarnation = from_incarnation;
  entry->use = *std::move(use);
  if (!ask.pieces.empty()) {
    auto pieces = std::make_shared<Segments>();
    pieces->list = std::move(ask.pieces);
    entry->pieces = std::move(pieces);
  }
  if (notify.has_value()) {
    entry->notify = std::move(notify);
    entry->owner = owner;
    entry->from_node = from_node;
    entry->transfer_id = transfer_id;
  }
  if (make != nullptr) {
    GPUMOVE_RETURN_IF_ERROR(make(entry->use, &entry->parts));
  }
  const Held held{entry->use.data(), entry->use.length(), entry->use.kind(), entry->use.device()};
  absl::MutexLock lock(&mu_);
  auto& slot = holds_[Key(from_node, transfer_id)];
  if (slot != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat("transfer ", Quoted(transfer_id), " already holds a range"));
  }
  slot = std::move(entry);
  return held;
}

absl::StatusOr<HoldTable::Ref> HoldTable::Find(const std::string& from_node,
                                               const std::string& transfer_id) const {
  absl::MutexLock lock(&mu_);
  auto it = holds_.find(Key(from_node, transfer_id));
  if (it == holds_.end()) return NoHold(from_node, transfer_id);
  return Ref(it->second);
}

bool HoldTable::EndBlocks(const std::string& from_node, const std::string& transfer_id) const {
  absl::MutexLock lock(&mu_);
  auto it = holds_.find(Key(from_node, transfer_id));
  if (it == holds_.end()) return false;
  for (const auto& p : it->second->parts) {
    if (p->EndBlocks()) return true;
  }
  return false;
}

absl::StatusOr<uint64_t> HoldTable::Complete(const std::string& from_node,
                                             const std::string& transfer_id, bool checksum,
                                             bool runner_ok, const AckTail& tail,
                                             absl::Duration tail_wait,
                                             std::optional<uint64_t> source_xxh3) {
  const absl::Time arrived = absl::Now();
  std::shared_ptr<Entry> entry;
  {
    absl::MutexLock lock(&mu_);
    auto it = holds_.find(Key(from_node, transfer_id));
    if (it == holds_.end()) return NoHold(from_node, transfer_id);
    entry = std::move(it->second);
    holds_.erase(it);
  }
  for (const auto& part : entry->parts) {
    absl::Status st = part->End(runner_ok);
    if (!st.ok() && runner_ok) return st;
  }
  const BufferUse& u = entry->use;
  if (runner_ok && !tail.token.empty()) {
    if (tails_ == nullptr) {
      return absl::FailedPreconditionError(
          "waiting for the runner's copy to end: this node cannot read the move's tail");
    }
    absl::Status st;
    if (tail.runner_waits && !checksum) {
      // One look, which also refuses a token the reader will not take: a copy still
      // running is acknowledged now (the runner sees it end itself) and its hold ends
      // when this node sees it end too.
      st = tails_->Wait(u, tail, arrived, absl::InfinitePast());
      if (absl::IsDeadlineExceeded(st)) {
        entry->use.MarkEnding();
        EndLater(Ending{std::move(entry),
                        absl::StrCat("transfer ", transfer_id, " from ", from_node), tail,
                        arrived, arrived + tail_wait});
        return 0;
      }
    } else {
      st = tails_->Wait(u, tail, arrived, absl::Now() + tail_wait);
    }
    if (!st.ok()) {
      return absl::Status(st.code(),
                          absl::StrCat("waiting for the runner's copy to end: ", st.message()));
    }
  }
  if (!runner_ok) return 0;
  if (!checksum) {
    Publish(*entry);
    return 0;
  }
  const Endpoint here{u.data(), u.kind(), u.device()};
  auto hash =
      entry->pieces != nullptr ? piece_hasher_(here, *entry->pieces) : hasher_(here, u.length());
  if (hash.ok() && (!source_xxh3.has_value() || *source_xxh3 == *hash)) Publish(*entry);
  return hash;
}

void HoldTable::Publish(const Entry& entry) const {
  if (!entry.notify.has_value() || notifications_ == nullptr) return;
  notifications_->Publish(entry.owner,
                          Notification{entry.transfer_id, entry.from_node, entry.use.buffer_id(),
                                       *entry.notify, absl::Now()});
}

bool HoldTable::AnswersTailAtOnce(const AckTail& tail, bool checksum) const {
  return tail.runner_waits && !checksum && tails_ != nullptr && tails_->Knows(tail.token);
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
    const Ending* wait;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !ending_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (ending_.empty()) return;  // Stopping, every hold ended.
      wait = &ending_.front();  // Left in the queue meanwhile, so size() counts it.
    }
    // Only this thread pops the queue: the front stays put while it waits.
    const absl::Status st =
        tails_->Wait(wait->entry->use, wait->tail, wait->arrived, wait->deadline);
    Ending e;
    absl::MutexLock lock(&mu_);
    e = std::move(ending_.front());
    ending_.pop_front();
    if (!st.ok()) {
      // The runner saw its own copy end or fail: this node only lets the range go.
      LOG(WARNING) << "the hold of " << e.what
                   << " ends without this node seeing the runner's copy end: " << st;
    } else {
      Publish(*e.entry);
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
