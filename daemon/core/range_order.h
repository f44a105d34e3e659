// The order of moves over overlapping bytes: the scheduler's dependency graph.
#ifndef GPUMOVE_DAEMON_CORE_RANGE_ORDER_H_
#define GPUMOVE_DAEMON_CORE_RANGE_ORDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "daemon/core/range.h"

namespace gpumove {

// Moves run in the order they were added wherever their bytes conflict: a move waits for
// every earlier unfinished move that writes what it reads or writes, or reads what it
// writes; moves over disjoint bytes (or that only read the same bytes) do not wait for
// each other. A move waits directly only for the earlier conflicting moves not already
// ordered before one it waits for, so a batch of moves over one range costs one edge
// each, not one per move before it. Not thread-safe: the scheduler's lock guards it.
class RangeOrder {
 public:
  using Id = uint64_t;

  // Adds move `id` (new) after every move added before it. The ranges are read until
  // End(id) and must stay valid until then. Returns whether it waits for an earlier move
  // (false: it may run now).
  bool Add(Id id, const RangeSpec* source, const RangeSpec* destination);
  // Move `id` ended: ran, failed, or was cancelled while it waited. Appends to `ready` the
  // moves that wait for nothing now and have not ended. One that ended while it waited
  // keeps the moves after it waiting until its own predecessors end (they may be ordered
  // after those through it alone).
  void End(Id id, std::vector<Id>& ready);

  // How many moves `id` waits for directly (0 for one not known).
  int waits_for(Id id) const;
  // Moves known: not ended, or ended while waiting.
  size_t size() const { return moves_.size(); }

 private:
  struct Move {
    const RangeSpec* source;
    const RangeSpec* destination;
    int pending = 0;  // Earlier moves it waits for.
    std::vector<Id> dependents;
    bool ended = false;
  };

  // A move touching a buffer: whether it reads it (its source is there), writes it, or
  // both.
  struct Touch {
    Id id;
    bool reads;
    bool writes;
  };

  static std::string BufferKey(const RangeSpec& r);
  // Makes `id` wait for the moves of `earlier` (unfinished, touching the buffer of `in`,
  // in order) that it must follow.
  void AddEdges(Id id, Move& move, const RangeSpec& in, const std::vector<Touch>& earlier);
  void Unlist(Id id, const Move& move);

  absl::flat_hash_map<Id, Move> moves_;
  // Unfinished moves touching each buffer, in the order they were added.
  absl::flat_hash_map<std::string, std::vector<Touch>> by_buffer_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_CORE_RANGE_ORDER_H_
