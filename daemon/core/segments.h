// Vectored moves: the pieces of one transfer, each `length` bytes from `src` (relative to
// the transfer's source range) to `dst` (relative to its destination range). Built from a
// list of segments or a compact block list, checked before anything runs: no empty piece,
// no offset + length past 2^64, no two destination pieces sharing a byte, at most a
// configured number of pieces.
#ifndef GPUMOVE_DAEMON_CORE_SEGMENTS_H_
#define GPUMOVE_DAEMON_CORE_SEGMENTS_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/common/segment.h"

namespace gpumove {

// A block list as the API gives it: block i copies block_size bytes from
// source_blocks[i] * source_stride to destination_blocks[i] * destination_stride
// (strides 0: block_size).
// One side's block indices, a view of 64-bit or of 32-bit integers (the API's two forms;
// no copy of the request's arrays).
class BlockIndices {
 public:
  BlockIndices() = default;
  BlockIndices(absl::Span<const uint64_t> wide) : wide_(wide) {}
  BlockIndices(absl::Span<const uint32_t> narrow) : narrow_(narrow) {}
  BlockIndices(const std::vector<uint64_t>& wide) : wide_(wide) {}
  BlockIndices(const std::vector<uint32_t>& narrow) : narrow_(narrow) {}
  size_t size() const { return wide_.empty() ? narrow_.size() : wide_.size(); }
  uint64_t operator[](size_t i) const { return wide_.empty() ? narrow_[i] : wide_[i]; }

 private:
  absl::Span<const uint64_t> wide_;
  absl::Span<const uint32_t> narrow_;
};

struct BlockListSpec {
  uint64_t block_size = 0;
  uint64_t source_stride = 0;
  uint64_t destination_stride = 0;
  BlockIndices source_blocks;
  BlockIndices destination_blocks;
};

struct Segments {
  std::vector<Segment> list;
  uint64_t total = 0;  // Bytes over all pieces.
  // The smallest ranges holding every piece: [src_lo, src_hi) and [dst_lo, dst_hi).
  uint64_t src_lo = 0, src_hi = 0, dst_lo = 0, dst_hi = 0;
  // For a list kept for many moves (prepared pieces): the same pieces rebased (below),
  // made once; null otherwise.
  std::shared_ptr<const Segments> rebased;
  // Nonzero for a kept list (and its rebased form): a number no other list gets, under
  // which copies may keep what they derive from it (a GPU's kernel descriptors).
  uint64_t serial = 0;
};
// A new number for Segments.serial.
uint64_t NextListSerial();

// Checks `list` (INVALID_ARGUMENT: empty, a piece of length 0, an end past 2^64,
// destination pieces that overlap; RESOURCE_EXHAUSTED: more than `max_pieces`) and
// returns it with its totals and bounds.
absl::StatusOr<std::shared_ptr<const Segments>> MakeSegments(std::vector<Segment> list,
                                                             size_t max_pieces);
// The pieces of a block list, checked as MakeSegments does (INVALID_ARGUMENT also for a
// block size of 0, lists of different lengths, index × stride past 2^64).
absl::StatusOr<std::shared_ptr<const Segments>> ExpandBlocks(const BlockListSpec& blocks,
                                                             size_t max_pieces);
// Checks pieces another node named in a range of `range` bytes it holds (untrusted):
// each non-empty and inside the range (Segment.src is the offset; dst is not looked at),
// at most `max_pieces` of them (INVALID_ARGUMENT otherwise). Returns their total bytes.
absl::StatusOr<uint64_t> CheckPiecesIn(const std::vector<Segment>& pieces, uint64_t range,
                                       size_t max_pieces);
// The same pieces with their offsets made relative to [src_lo, ...) and [dst_lo, ...):
// for the bounding ranges a transfer holds.
std::shared_ptr<const Segments> Rebased(const Segments& s);
// Cuts pieces [begin, end) (of `bytes` bytes in all) into `parts` runs of about equal
// bytes at piece boundaries: run k is [cut[k], cut[k + 1]).
std::vector<size_t> CutPieces(const std::vector<Segment>& list, size_t begin, size_t end,
                              uint64_t bytes, int parts);
// The end of a round of pieces from `begin`: as many as fit in `round_bytes` (at least
// one); their bytes in `*bytes`.
size_t RoundEnd(const std::vector<Segment>& list, size_t begin, uint64_t round_bytes,
                uint64_t* bytes);
// Copies host pieces [begin, end) (`bytes` in all) from src + piece.src to
// dst + piece.dst, split over up to `threads` copy threads in runs of at least
// kParallelCopyPart bytes.
void CopyPieces(char* dst, const char* src, const std::vector<Segment>& list, size_t begin,
                size_t end, uint64_t bytes, int threads);
// The pieces' bytes one after another in list order (the packed stream a staged or MPI
// move carries): which parts of which pieces packed bytes [offset, offset + n) are, for
// moving a vectored transfer through a pipeline of contiguous chunks.
class PackedPieces {
 public:
  explicit PackedPieces(const Segments& s);
  uint64_t total() const { return total_; }
  // Calls `part(src, dst, length, at)` for each part of a piece in packed bytes
  // [offset, offset + n), in order: the part's offsets in the source and destination
  // ranges and its place in the window (`at` from 0 to n).
  template <typename Part>
  void ForEach(uint64_t offset, uint64_t n, const Part& part) const {
    const uint64_t end = offset + n;
    for (size_t i = First(offset); i < list_->size() && starts_[i] < end; ++i) {
      const Segment& p = (*list_)[i];
      const uint64_t lo = std::max(offset, starts_[i]);
      const uint64_t hi = std::min(end, starts_[i] + p.length);
      part(p.src + (lo - starts_[i]), p.dst + (lo - starts_[i]), hi - lo, lo - offset);
    }
  }
  // The number of pieces (or parts of them) in packed bytes [offset, offset + n).
  size_t Count(uint64_t offset, uint64_t n) const;

 private:
  size_t First(uint64_t offset) const;  // The piece holding packed byte `offset`.
  const std::vector<Segment>* list_;
  std::vector<uint64_t> starts_;  // Packed offset of each piece.
  uint64_t total_ = 0;
};

// The same, without a copy when the offsets start at 0 already or `s` keeps its rebased
// pieces.
std::shared_ptr<const Segments> Rebased(std::shared_ptr<const Segments> s);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_CORE_SEGMENTS_H_
