// The holding side of node-to-node moves: ranges of this node's buffers held in use for
// moves that other nodes run, from PrepareRemote until CompleteRemote, or until the
// runner is seen down or restarted, each with its paths' parts (path_holder.h).
#ifndef GPUMOVE_DAEMON_PEER_HOLDS_H_
#define GPUMOVE_DAEMON_PEER_HOLDS_H_

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
#include "daemon/core/notifications.h"
#include "daemon/peer/path_holder.h"

namespace gpumove {

// What the runner asks of a hold besides its range.
struct HoldAsk {
  // A destination's notify bytes: published when the hold ends with the move's bytes in.
  std::optional<std::string> notify;
  // A checksummed vectored move's pieces in the range (Segment.src = Segment.dst = the
  // offset from the range's start), in list order: the checksum is over them.
  std::vector<Segment> pieces;
};

// xxh3-64 of pieces of an endpoint, in list order (their src offsets).
using HeldPieceHasher = std::function<absl::StatusOr<uint64_t>(const Endpoint&, const Segments&)>;

class HoldTable {
 public:
  // `registry` and `hasher` (and `tails`, and `notifications`) must outlive the table.
  // `tails` reads the tails runners' acknowledgements carry (null: such acknowledgements
  // are refused). Holds of destinations with notify bytes publish to `notifications` when they
  // end with the bytes in (null: such holds are refused).
  // `piece_hasher` hashes the pieces of checksummed vectored moves (null: such holds are
  // refused).
  HoldTable(BufferRegistry* registry,
            std::function<absl::StatusOr<uint64_t>(const Endpoint&, uint64_t)> hasher,
            TailReader* tails = nullptr, NotificationLog* notifications = nullptr,
            HeldPieceHasher piece_hasher = nullptr)
      : registry_(registry),
        hasher_(std::move(hasher)),
        tails_(tails),
        notifications_(notifications),
        piece_hasher_(std::move(piece_hasher)) {}
  // Waits for the holds still ending (their tails land or time out).
  ~HoldTable();
  HoldTable(const HoldTable&) = delete;
  HoldTable& operator=(const HoldTable&) = delete;

  // What a new hold is, copied out of the table: another call may end the hold as soon as
  // Hold returns, so nothing here points into it (the range's bytes stay the registry's).
  struct Held {
    char* data = nullptr;
    uint64_t length = 0;
    MemoryKind kind = MemoryKind::kHost;
    int device = kHostDevice;
  };
  // The paths' parts of a new hold, made once its range is in use (PathHolder::Offer).
  using PartMaker =
      std::function<absl::Status(const BufferUse& range, std::vector<std::unique_ptr<HoldPart>>*)>;
  // Checks and holds a range for (from_node, transfer_id), with the parts `make` gives
  // (an error from it refuses the hold). ALREADY_EXISTS for a repeat. `ask`: notify bytes
  // (published when the hold ends with the move's bytes in place) and pieces to hash
  // (INVALID_ARGUMENT for one outside the range, or an empty one).
  absl::StatusOr<Held> Hold(const std::string& from_node, uint64_t from_incarnation,
                            const std::string& transfer_id, const std::string& owner,
                            const std::string& buffer_id, uint64_t offset, uint64_t length,
                            const PartMaker& make = nullptr, HoldAsk ask = {});

  struct Entry;
  // A hold kept alive while a call uses it: its range stays in use, and its parts stay,
  // even if Complete or ReleaseFrom ends the hold meanwhile.
  class Ref {
   public:
    const BufferUse& range() const;
    // The hold's part of type T (a path's own), or null.
    template <class T>
    T* part() const {
      for (HoldPart* p : parts()) {
        if (T* t = dynamic_cast<T*>(p)) return t;
      }
      return nullptr;
    }

   private:
    friend class HoldTable;
    explicit Ref(std::shared_ptr<Entry> entry) : entry_(std::move(entry)) {}
    std::vector<HoldPart*> parts() const;
    std::shared_ptr<Entry> entry_;
  };
  // NOT_FOUND: no such hold.
  absl::StatusOr<Ref> Find(const std::string& from_node, const std::string& transfer_id) const;
  // Whether ending the hold may block (a part's End does).
  bool EndBlocks(const std::string& from_node, const std::string& transfer_id) const;

  // Ends a hold; with `checksum`, hashes the range first. NOT_FOUND for no such hold. Its
  // parts end first (HoldPart::End, with `runner_ok`); when the runner says OK but a part
  // failed, that is the answer. A `tail` (the move's last bytes still landing,
  // CompleteRemoteRequest.tail_token) is seen land by the TailReader (waiting up to
  // `tail_wait`) before the hold ends or is hashed; a tail this node cannot see land (no
  // reader, a token it refuses, too slow) is the answer, and the hold ends. When the
  // runner waits for its tail too (tail.runner_waits) and no checksum is asked, a tail
  // that has not landed is not waited for here: the answer is OK at once, and the hold
  // ends on a thread of the table's own when it lands (or fails, or `tail_wait` runs out);
  // meanwhile its range is in an ending use (a Release waits for it) and size() counts it.
  // The hold's notification is published once the bytes are in: after the parts ended
  // and the tail landed, and with `source_xxh3` only when the range hashes to it.
  absl::StatusOr<uint64_t> Complete(const std::string& from_node, const std::string& transfer_id,
                                    bool checksum, bool runner_ok = true,
                                    const AckTail& tail = {},
                                    absl::Duration tail_wait = kTailWait,
                                    std::optional<uint64_t> source_xxh3 = std::nullopt);
  static constexpr absl::Duration kTailWait = absl::Seconds(10);
  // Whether Complete with `tail` answers without waiting: the runner waits for its tail
  // itself, no checksum is asked, and the reader has looked at that token before.
  bool AnswersTailAtOnce(const AckTail& tail, bool checksum) const;
  // Ends every hold of a node's incarnation (it went down or restarted); not those
  // already ending behind a tail (they end when it lands or times out).
  int ReleaseFrom(const std::string& node, uint64_t incarnation);
  size_t size() const;

 private:
  BufferRegistry* const registry_;
  const std::function<absl::StatusOr<uint64_t>(const Endpoint&, uint64_t)> hasher_;
  TailReader* const tails_;
  NotificationLog* const notifications_;
  const HeldPieceHasher piece_hasher_;
  // Publishes the notification of a hold whose bytes are in (if it has one).
  void Publish(const Entry& entry) const;
  mutable absl::Mutex mu_;
  // Key: from_node + '\n' + transfer_id. Shared: a call using the hold (Ref) keeps it.
  absl::flat_hash_map<std::string, std::shared_ptr<Entry>> holds_ ABSL_GUARDED_BY(mu_);

  // Holds acknowledged before their tail landed, ended in order by `ender_` once
  // TailReader::Wait returns.
  struct Ending {
    std::shared_ptr<Entry> entry;
    std::string what;  // For the log: the transfer and its runner.
    AckTail tail;
    absl::Time arrived, deadline;
  };
  void EndLater(Ending ending);
  void EndLoop();
  std::deque<Ending> ending_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread ender_;  // Started with the first Ending.
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PEER_HOLDS_H_
