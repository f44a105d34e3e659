#include "daemon/core/segments.h"

#include <algorithm>
#include <atomic>
#include <limits>

#include "absl/strings/str_cat.h"
#include "daemon/common/host_copy.h"

namespace gpumove {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

}  // namespace

namespace {

absl::StatusOr<std::shared_ptr<const Segments>> Checked(std::vector<Segment> list,
                                                        size_t max_pieces,
                                                        bool destinations_checked);

}  // namespace

absl::StatusOr<std::shared_ptr<const Segments>> MakeSegments(std::vector<Segment> list,
                                                             size_t max_pieces) {
  return Checked(std::move(list), max_pieces, false);
}

namespace {

absl::StatusOr<std::shared_ptr<const Segments>> Checked(std::vector<Segment> list,
                                                        size_t max_pieces,
                                                        bool destinations_checked) {
  if (list.empty()) return absl::InvalidArgumentError("a vectored move with no pieces");
  if (list.size() > max_pieces) {
    return absl::ResourceExhaustedError(absl::StrCat(list.size(), " pieces in one move; at most ",
                                                     max_pieces, " (--max_blocks_per_move)"));
  }
  auto s = std::make_shared<Segments>();
  s->src_lo = s->dst_lo = kMax;
  bool sorted = true;
  for (size_t i = 0; i < list.size(); ++i) {
    const Segment& p = list[i];
    if (p.length == 0) {
      return absl::InvalidArgumentError(absl::StrCat("piece ", i, " has length 0"));
    }
    if (p.src > kMax - p.length || p.dst > kMax - p.length) {
      return absl::InvalidArgumentError(absl::StrCat("piece ", i, " ends past 2^64"));
    }
    if (s->total > kMax - p.length) {
      return absl::InvalidArgumentError("the pieces add up to more than 2^64 bytes");
    }
    s->total += p.length;
    s->src_lo = std::min(s->src_lo, p.src);
    s->src_hi = std::max(s->src_hi, p.src + p.length);
    s->dst_lo = std::min(s->dst_lo, p.dst);
    s->dst_hi = std::max(s->dst_hi, p.dst + p.length);
    if (i > 0 && p.dst < list[i - 1].dst) sorted = false;
  }
  // Destination pieces may not share a byte: checked in destination order.
  auto overlapping = [](const Segment& a, const Segment& b) { return b.dst < a.dst + a.length; };
  if (destinations_checked) {
    // The caller saw no two destination pieces share a byte.
  } else if (sorted) {
    for (size_t i = 1; i < list.size(); ++i) {
      if (overlapping(list[i - 1], list[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("destination pieces ", i - 1, " and ", i, " overlap"));
      }
    }
  } else {
    std::vector<std::pair<uint64_t, uint32_t>> order(list.size());
    for (size_t i = 0; i < list.size(); ++i) order[i] = {list[i].dst, static_cast<uint32_t>(i)};
    std::sort(order.begin(), order.end());
    for (size_t k = 1; k < order.size(); ++k) {
      const Segment& a = list[order[k - 1].second];
      const Segment& b = list[order[k].second];
      if (overlapping(a, b)) {
        return absl::InvalidArgumentError(absl::StrCat("destination pieces ", order[k - 1].second,
                                                       " and ", order[k].second, " overlap"));
      }
    }
  }
  s->list = std::move(list);
  return std::shared_ptr<const Segments>(std::move(s));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Segments>> ExpandBlocks(const BlockListSpec& b,
                                                             size_t max_pieces) {
  if (b.block_size == 0) return absl::InvalidArgumentError("block_size is 0");
  if (b.source_blocks.size() != b.destination_blocks.size()) {
    return absl::InvalidArgumentError(absl::StrCat(b.source_blocks.size(), " source blocks but ",
                                                   b.destination_blocks.size(),
                                                   " destination blocks"));
  }
  if (b.source_blocks.size() > max_pieces) {
    return absl::ResourceExhaustedError(absl::StrCat(b.source_blocks.size(),
                                                     " blocks in one move; at most ", max_pieces,
                                                     " (--max_blocks_per_move)"));
  }
  const uint64_t ss = b.source_stride == 0 ? b.block_size : b.source_stride;
  const uint64_t ds = b.destination_stride == 0 ? b.block_size : b.destination_stride;
  std::vector<Segment> list(b.source_blocks.size());
  uint64_t highest = 0;
  // The highest indices whose offsets fit, divided once (a division per block was most
  // of the time a 65536-block list took to read).
  const uint64_t s_most = kMax / ss, d_most = kMax / ds;
  for (size_t i = 0; i < list.size(); ++i) {
    const uint64_t si = b.source_blocks[i], di = b.destination_blocks[i];
    if (si > s_most || di > d_most) {
      return absl::InvalidArgumentError(absl::StrCat("block ", i, ": index × stride past 2^64"));
    }
    list[i] = Segment{si * ss, di * ds, b.block_size};
    highest = std::max(highest, di);
  }
  // Blocks no closer than their size overlap only when their destination index repeats:
  // told by a bitmap of the indices (when it is not much bigger than the list) rather
  // than by sorting.
  const bool apart = ds >= b.block_size;
  if (apart && highest / 64 <= 4 * list.size() + 64) {
    std::vector<uint64_t> seen(highest / 64 + 1, 0);
    for (size_t i = 0; i < list.size(); ++i) {
      const uint64_t di = b.destination_blocks[i];
      uint64_t& word = seen[di / 64];
      const uint64_t bit = uint64_t{1} << (di % 64);
      if (word & bit) {
        return absl::InvalidArgumentError(
            absl::StrCat("destination block ", di, " is written twice (block ", i, ")"));
      }
      word |= bit;
    }
    return Checked(std::move(list), max_pieces, true);
  }
  return MakeSegments(std::move(list), max_pieces);
}

std::vector<size_t> CutPieces(const std::vector<Segment>& list, size_t begin, size_t end,
                              uint64_t bytes, int parts) {
  std::vector<size_t> cut(parts + 1, end);
  cut[0] = begin;
  uint64_t acc = 0;
  int next = 1;
  for (size_t i = begin; i < end && next < parts; ++i) {
    acc += list[i].length;
    while (next < parts && acc * parts >= bytes * next) cut[next++] = i + 1;
  }
  return cut;
}

size_t RoundEnd(const std::vector<Segment>& list, size_t begin, uint64_t round_bytes,
                uint64_t* bytes) {
  size_t end = begin;
  *bytes = 0;
  while (end < list.size() && (*bytes == 0 || *bytes + list[end].length <= round_bytes)) {
    *bytes += list[end++].length;
  }
  return end;
}

void CopyPieces(char* dst, const char* src, const std::vector<Segment>& list, size_t begin,
                size_t end, uint64_t bytes, int threads) {
  const int parts = static_cast<int>(
      std::clamp<uint64_t>(bytes / kParallelCopyPart, 1, static_cast<uint64_t>(threads)));
  const std::vector<size_t> cut = CutPieces(list, begin, end, bytes, parts);
  RunCopyParts(parts, [&](int part) {
    for (size_t i = cut[part]; i < cut[part + 1]; ++i) {
      const Segment& p = list[i];
      HostCopy(dst + p.dst, src + p.src, p.length);
    }
  });
}

absl::StatusOr<uint64_t> CheckPiecesIn(const std::vector<Segment>& pieces, uint64_t range,
                                       size_t max_pieces) {
  if (pieces.size() > max_pieces) {
    return absl::InvalidArgumentError(absl::StrCat(pieces.size(), " pieces; at most ", max_pieces));
  }
  uint64_t total = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Segment& p = pieces[i];
    if (p.length == 0 || p.src > range || p.length > range - p.src) {
      return absl::InvalidArgumentError(absl::StrCat("piece ", i, " (", p.src, "+", p.length,
                                                     ") is not in the ", range, "-byte range"));
    }
    if (total + p.length < total) return absl::InvalidArgumentError("the pieces add up past 2^64");
    total += p.length;
  }
  return total;
}

std::shared_ptr<const Segments> Rebased(std::shared_ptr<const Segments> s) {
  if (s->src_lo == 0 && s->dst_lo == 0) return s;
  if (s->rebased != nullptr) return s->rebased;
  return Rebased(*s);
}

uint64_t NextListSerial() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

std::shared_ptr<const Segments> Rebased(const Segments& s) {
  auto out = std::make_shared<Segments>(s);
  out->rebased = nullptr;
  out->serial = s.serial == 0 ? 0 : NextListSerial();
  for (Segment& p : out->list) {
    p.src -= s.src_lo;
    p.dst -= s.dst_lo;
  }
  out->src_hi -= s.src_lo;
  out->dst_hi -= s.dst_lo;
  out->src_lo = out->dst_lo = 0;
  return out;
}

PackedPieces::PackedPieces(const Segments& s) : list_(&s.list) {
  starts_.reserve(s.list.size());
  for (const Segment& p : s.list) {
    starts_.push_back(total_);
    total_ += p.length;
  }
}

size_t PackedPieces::First(uint64_t offset) const {
  return static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) -
                             starts_.begin()) -
         (starts_.empty() ? 0 : 1);
}

size_t PackedPieces::Count(uint64_t offset, uint64_t n) const {
  if (n == 0 || starts_.empty()) return 0;
  const size_t first = First(offset);
  const size_t past = static_cast<size_t>(
      std::lower_bound(starts_.begin(), starts_.end(), offset + n) - starts_.begin());
  return past - first;
}

}  // namespace gpumove
