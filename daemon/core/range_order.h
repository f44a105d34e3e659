// The order of moves over overlapping bytes: the scheduler's dependency graph.
#ifndef GPUMOVE_DAEMON_CORE_RANGE_ORDER_H_
#define GPUMOVE_DAEMON_CORE_RANGE_ORDER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "daemon/common/segment.h"
#include "daemon/core/range.h"

namespace gpumove {

// Moves run in the order they were added wherever their bytes conflict: a move waits for
// every earlier unfinished move that writes what it reads or writes, or reads what it
// writes; moves over disjoint bytes (or that only read the same bytes) do not wait for
// each other. A move waits directly only for the earlier conflicting moves not already
// ordered before one it waits for, so a batch of moves over one range costs one edge
// each, not one per move before it. Not thread-safe: the scheduler's lock guards it.
// The bytes a vectored move reads and writes within its ranges: sorted, merged, disjoint
// [begin, end) spans of buffer offsets (absolute, not relative to the range).
struct PieceSpans {
  std::vector<std::pair<uint64_t, uint64_t>> source, destination;
};
// The spans of `pieces` (offsets relative to source_offset and destination_offset).
PieceSpans SpansOf(const std::vector<Segment>& pieces, uint64_t source_offset,
                   uint64_t destination_offset);

class RangeOrder {
 public:
  using Id = uint64_t;

  // Adds move `id` (new) after every move added before it. The ranges (and `pieces`, a
  // vectored move's pieces relative to them, or null for whole ranges) are read until
  // End(id) and must stay valid until then. Returns whether it waits for an earlier move
  // (false: it may run now). Vectored moves conflict only where their pieces do; their
  // spans are made the first time a move's ranges meet another's (a move alone on its
  // buffers costs nothing for them).
  bool Add(Id id, const RangeSpec* source, const RangeSpec* destination,
           const std::vector<Segment>* pieces = nullptr);
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
    const std::vector<Segment>* pieces = nullptr;
    std::unique_ptr<PieceSpans> spans;  // Of the pieces, made when first needed.
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
  // A vectored move's spans are remembered as covering bytes up to this many (each is a
  // linear insert); past it they cover nothing (safe: only more edges).
  static constexpr size_t kMaxCoveredSpans = 64;
  // Makes `id` wait for the moves of `earlier` (unfinished, touching the buffer of `in`,
  // in order) that it must follow.
  void AddEdges(Id id, Move& move, const RangeSpec& in, const std::vector<Touch>& earlier);
  void Unlist(Id id, const Move& move);
  // The spans of a vectored move (made now if not yet); null for whole ranges.
  static const PieceSpans* SpansFor(Move& move);

  absl::flat_hash_map<Id, Move> moves_;
  // Unfinished moves touching each buffer, in the order they were added.
  absl::flat_hash_map<std::string, std::vector<Touch>> by_buffer_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_CORE_RANGE_ORDER_H_
