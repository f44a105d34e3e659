// Notifications of moves that carry notify bytes (TransferSpec.notify): published by the
// node that owns a move's destination buffer once the bytes are visible there, kept in a
// bounded log per tenant, and read by subscribers in order from a sequence number on.
//
//   NotificationLog log(/*capacity=*/1024);
//   log.Publish("tenant-a", {.transfer_id = "t-1.a", .destination_buffer = "b-7", ...});
//   auto batch = log.Read("tenant-a", /*after=*/0, {}, 64, absl::Now() + absl::Seconds(1));
//
// Each tenant's notifications are numbered 1, 2, ... on this node, and an admin's
// (kAnyOwner) stream numbers every tenant's: a tenant learns nothing of another's
// notifications, not even their count, and one tenant's burst never pushes another's
// out of the log.
#ifndef GPUMOVE_DAEMON_CORE_NOTIFICATIONS_H_
#define GPUMOVE_DAEMON_CORE_NOTIFICATIONS_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gpumove {

// The most notify bytes a move may carry.
inline constexpr size_t kMaxNotifyBytes = 4096;

struct Notification {
  std::string transfer_id;
  std::string source_node;
  std::string destination_buffer;
  std::string notify;
  absl::Time time = absl::InfinitePast();
};

class NotificationLog {
 public:
  // Keeps the newest `capacity` notifications of each tenant (and as many of all).
  explicit NotificationLog(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}
  NotificationLog(const NotificationLog&) = delete;
  NotificationLog& operator=(const NotificationLog&) = delete;

  // Adds a notification of a move `owner` ran, and wakes the readers.
  void Publish(const std::string& owner, Notification n);

  struct Entry {
    uint64_t sequence = 0;  // In the reader's numbering.
    std::shared_ptr<const Notification> notification;
    // Those before it (after the reader's `after`) no longer kept, whatever `accept` says.
    uint64_t missed = 0;
  };
  struct Batch {
    std::vector<Entry> entries;
    // Where the next Read goes on from (the last sequence this one looked at).
    uint64_t next_after = 0;
  };
  // Notifications that `reader` (a tenant, or kAnyOwner for all) may see, numbered after
  // `after`, that `accept` takes (null: all), at most `max`. When there are none yet,
  // waits until `deadline` (or Stop) for one.
  Batch Read(const std::string& reader, uint64_t after,
             const std::function<bool(const Notification&)>& accept, size_t max,
             absl::Time deadline);
  // The newest sequence number in `reader`'s numbering (0: none yet): a subscriber that
  // wants new notifications only starts after it.
  uint64_t Last(const std::string& reader) const;
  // For readers that hold no thread (the server's callback reactors): runs `published`
  // each time a notification `reader` may see is published, and once at Stop, under the
  // log's lock: it must not block or call the log (it posts a wake-up). Returns an id for
  // Unlisten.
  uint64_t Listen(const std::string& reader, std::function<void()> published);
  // Once it returns, the listener of `id` is neither called nor running.
  void Unlisten(uint64_t id);
  // Wakes every reader; Read no longer waits.
  void Stop();
  bool stopped() const;

 private:
  struct Stream {
    uint64_t published = 0;                                // The newest sequence number.
    std::deque<std::shared_ptr<const Notification>> kept;  // Sequences published-size+1...
  };
  void AppendLocked(Stream& s, const std::shared_ptr<const Notification>& n)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TellLocked(const std::string& reader) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  absl::flat_hash_map<std::string, Stream> streams_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // Listen: id -> reader, and reader -> its listeners.
  absl::flat_hash_map<uint64_t, std::string> listener_readers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::flat_hash_map<uint64_t, std::function<void()>>> listeners_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_listener_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_CORE_NOTIFICATIONS_H_
