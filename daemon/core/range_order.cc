#include "daemon/core/range_order.h"

#include <algorithm>
#include <bit>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gpumove {
namespace {

// Byte ranges of one buffer, kept sorted and merged.
class Covered {
 public:
  void Add(uint64_t offset, uint64_t length) {
    if (length == 0) return;
    uint64_t begin = offset, end = offset + length;
    std::vector<std::pair<uint64_t, uint64_t>> out;
    out.reserve(ranges_.size() + 1);
    bool placed = false;
    for (const auto& [b, e] : ranges_) {
      if (e < begin) {
        out.emplace_back(b, e);
      } else if (end < b) {
        if (!placed) out.emplace_back(begin, end);
        placed = true;
        out.emplace_back(b, e);
      } else {
        begin = std::min(begin, b);
        end = std::max(end, e);
      }
    }
    if (!placed) out.emplace_back(begin, end);
    std::sort(out.begin(), out.end());
    ranges_ = std::move(out);
  }
  // Whether every byte of [offset, offset + length) is covered (an empty range is).
  bool Covers(uint64_t offset, uint64_t length) const {
    if (length == 0) return true;
    for (const auto& [b, e] : ranges_) {
      if (b <= offset && offset + length <= e) return true;
    }
    return false;
  }

 private:
  std::vector<std::pair<uint64_t, uint64_t>> ranges_;
};

bool SameBuffer(const RangeSpec& a, const RangeSpec& b) {
  return a.node == b.node && a.buffer_id == b.buffer_id;
}

using Spans = std::vector<std::pair<uint64_t, uint64_t>>;

// One side of a move: its pieces' spans, or its whole range as one span.
struct Side {
  const Spans* spans;
  std::pair<uint64_t, uint64_t> whole;
  size_t size() const { return spans != nullptr ? spans->size() : 1; }
  const std::pair<uint64_t, uint64_t>& operator[](size_t i) const {
    return spans != nullptr ? (*spans)[i] : whole;
  }
};

Side SideOf(const RangeSpec& r, const Spans* spans) {
  return Side{spans, {r.offset, r.offset + r.length}};
}

// Whether two sides share a byte within [lo, hi) (both sorted and disjoint): a merge walk
// from the first span reaching lo.
bool Intersect(const Side& a, const Side& b, uint64_t lo, uint64_t hi) {
  auto first = [lo](const Side& s) {
    if (s.spans == nullptr) return size_t{0};
    return static_cast<size_t>(
        std::upper_bound(s.spans->begin(), s.spans->end(), lo,
                         [](uint64_t v, const std::pair<uint64_t, uint64_t>& p) {
                           return v < p.second;
                         }) -
        s.spans->begin());
  };
  size_t i = first(a), j = first(b);
  while (i < a.size() && j < b.size()) {
    const auto& x = a[i];
    const auto& y = b[j];
    if (x.first >= hi || y.first >= hi) return false;
    if (x.first < y.second && y.first < x.second) return true;
    if (x.second <= y.second) {
      ++i;
    } else {
      ++j;
    }
  }
  return false;
}

// Sorts spans by their begin: a radix sort of 11-bit digits over the bits the begins use
// (a 65536-piece list in well under a millisecond, where std::sort took ~10 ms); lists
// already in order are left as they are.
void SortByBegin(Spans& spans) {
  auto by_begin = [](const std::pair<uint64_t, uint64_t>& a,
                     const std::pair<uint64_t, uint64_t>& b) { return a.first < b.first; };
  if (std::is_sorted(spans.begin(), spans.end(), by_begin)) return;
  if (spans.size() < 256) {
    std::sort(spans.begin(), spans.end(), by_begin);
    return;
  }
  uint64_t highest = 0;
  for (const auto& s : spans) highest |= s.first;
  constexpr int kBits = 11;
  constexpr size_t kBuckets = size_t{1} << kBits;
  Spans out(spans.size());
  std::vector<size_t> count(kBuckets);
  for (int shift = 0; shift < 64 && (highest >> shift) != 0; shift += kBits) {
    std::fill(count.begin(), count.end(), 0);
    for (const auto& s : spans) ++count[(s.first >> shift) & (kBuckets - 1)];
    size_t at = 0;
    for (size_t& c : count) {
      const size_t n = c;
      c = at;
      at += n;
    }
    for (const auto& s : spans) out[count[(s.first >> shift) & (kBuckets - 1)]++] = s;
    spans.swap(out);
  }
}

Spans Merged(Spans spans) {
  SortByBegin(spans);
  Spans out;
  for (const auto& s : spans) {
    if (!out.empty() && s.first <= out.back().second) {
      out.back().second = std::max(out.back().second, s.second);
    } else {
      out.push_back(s);
    }
  }
  return out;
}

// The spans of one side of `pieces` from a bitmap of units of their common power-of-two
// divisor (offsets and lengths): no sort, O(pieces + units / 64). False (nothing written) when
// the units would be too many: the bitmap much bigger than the list, or pieces of many
// units each.
bool SpansByBitmap(const std::vector<Segment>& pieces, bool source, uint64_t base,
                   Spans* out) {
  // The unit: the largest power of two dividing every offset and length (an OR and a
  // count of trailing zeros; a gcd per piece cost more than the rest together).
  uint64_t any = 0, hi = 0;
  for (const Segment& p : pieces) {
    const uint64_t off = source ? p.src : p.dst;
    any |= off | p.length;
    hi = std::max(hi, off + p.length);
  }
  if (any == 0) return false;
  const uint64_t g = uint64_t{1} << std::countr_zero(any);
  const size_t n = pieces.size();
  const uint64_t units = hi / g;
  if (units / 64 > 4 * n + 64) return false;
  uint64_t marked = 0;
  for (const Segment& p : pieces) marked += p.length / g;
  if (marked > 8 * n + 64) return false;
  std::vector<uint64_t> bits(units / 64 + 1, 0);
  for (const Segment& p : pieces) {
    const uint64_t begin = (source ? p.src : p.dst) / g, end = begin + p.length / g;
    for (uint64_t u = begin; u < end; ++u) bits[u / 64] |= uint64_t{1} << (u % 64);
  }
  out->clear();
  bool open = false;
  uint64_t start = 0;
  for (size_t w = 0; w < bits.size(); ++w) {
    const uint64_t word = bits[w];
    if ((word == 0 && !open) || (word == ~uint64_t{0} && open)) continue;
    for (int b = 0; b < 64; ++b) {
      const bool set = (word >> b) & 1;
      const uint64_t u = w * 64 + b;
      if (set && !open) {
        open = true;
        start = u;
      } else if (!set && open) {
        open = false;
        out->emplace_back(base + start * g, base + u * g);
      }
    }
  }
  if (open) out->emplace_back(base + start * g, base + bits.size() * 64 * g);
  return true;
}

Spans SideSpans(const std::vector<Segment>& pieces, bool source, uint64_t base) {
  Spans spans;
  if (SpansByBitmap(pieces, source, base, &spans)) return spans;
  spans.reserve(pieces.size());
  for (const Segment& p : pieces) {
    const uint64_t off = base + (source ? p.src : p.dst);
    spans.emplace_back(off, off + p.length);
  }
  return Merged(std::move(spans));
}

}  // namespace

PieceSpans SpansOf(const std::vector<Segment>& pieces, uint64_t source_offset,
                   uint64_t destination_offset) {
  return PieceSpans{SideSpans(pieces, true, source_offset),
                    SideSpans(pieces, false, destination_offset)};
}

std::string RangeOrder::BufferKey(const RangeSpec& r) {
  return absl::StrCat(r.node, "/", r.buffer_id);
}

const PieceSpans* RangeOrder::SpansFor(Move& move) {
  if (move.pieces == nullptr) return nullptr;
  if (move.spans == nullptr) {
    move.spans = std::make_unique<PieceSpans>(
        SpansOf(*move.pieces, move.source->offset, move.destination->offset));
  }
  return move.spans.get();
}

bool RangeOrder::Add(Id id, const RangeSpec* source, const RangeSpec* destination,
                     const std::vector<Segment>* pieces) {
  Move& move = moves_[id];
  move.source = source;
  move.destination = destination;
  move.pieces = pieces;
  const std::string sb = BufferKey(*source);
  const std::string db = BufferKey(*destination);
  for (const std::string* buffer : {&sb, &db}) {
    if (buffer == &db && db == sb) break;
    auto it = by_buffer_.find(*buffer);
    if (it != by_buffer_.end()) {
      AddEdges(id, move, buffer == &sb ? *source : *destination, it->second);
    }
  }
  if (db == sb) {
    by_buffer_[sb].push_back(Touch{id, true, true});
  } else {
    by_buffer_[sb].push_back(Touch{id, true, false});
    by_buffer_[db].push_back(Touch{id, false, true});
  }
  return move.pending > 0;
}

void RangeOrder::AddEdges(Id id, Move& move, const RangeSpec& in,
                          const std::vector<Touch>& earlier) {
  // An earlier e' whose conflict with this move lies in bytes that a move e it waits for
  // writes conflicts with e too, so e (newer) waits for it. The newest are looked at
  // first, the bytes their destinations cover are remembered, and the walk stops once
  // those cover this move's own ranges here.
  const bool writes = SameBuffer(*move.destination, in);
  const bool reads = SameBuffer(*move.source, in);
  Covered covered;
  for (auto it = earlier.rbegin(); it != earlier.rend(); ++it) {
    // Two moves that only read this buffer never conflict here (the common case of many
    // moves out of one source: no lookup, no comparison).
    if (!writes && !it->writes) continue;
    Move& e = moves_.at(it->id);
    bool conflict = false, shielded = true;
    // Side a of this move against side b of e (destination or source), by their ranges
    // and, where they meet and either is vectored, by their pieces.
    auto consider = [&](bool both_here, bool a_dst, bool b_dst) {
      if (!both_here) return;
      const RangeSpec& a = a_dst ? *move.destination : *move.source;
      const RangeSpec& b = b_dst ? *e.destination : *e.source;
      if (!RangesOverlap(a.offset, a.length, b.offset, b.length)) return;
      const uint64_t begin = std::max(a.offset, b.offset);
      const uint64_t end = std::min(a.offset + a.length, b.offset + b.length);
      const PieceSpans* ms = SpansFor(move);
      const PieceSpans* es = SpansFor(e);
      if (ms != nullptr || es != nullptr) {
        const Spans* a_spans = ms == nullptr ? nullptr : a_dst ? &ms->destination : &ms->source;
        const Spans* b_spans = es == nullptr ? nullptr : b_dst ? &es->destination : &es->source;
        if (!Intersect(SideOf(a, a_spans), SideOf(b, b_spans), begin, end)) {
          return;  // Their pieces share no byte.
        }
      }
      conflict = true;
      // Shielded only if the bytes covered include all of the ranges' common part (a
      // bound of the pieces' common bytes).
      if (!covered.Covers(begin, end - begin)) shielded = false;
    };
    consider(writes && it->writes, true, true);
    consider(writes && it->reads, true, false);
    consider(reads && it->writes, false, true);
    if (!conflict || shielded) continue;
    // Both of this move's buffers' lists may hold e: the edge is made once (only this
    // move is being added now, so it would be e's last dependent).
    if (e.dependents.empty() || e.dependents.back() != id) {
      e.dependents.push_back(id);
      ++move.pending;
    }
    // What e writes covers later conflicts: its whole range, or each of its pieces'
    // spans (a vectored move writes only those).
    if (it->writes) {
      const PieceSpans* es = SpansFor(e);
      if (es == nullptr) {
        covered.Add(e.destination->offset, e.destination->length);
      } else if (es->destination.size() <= kMaxCoveredSpans) {
        for (const auto& [b, end] : es->destination) covered.Add(b, end - b);
      }
    }
    const bool dst_done =
        !writes || covered.Covers(move.destination->offset, move.destination->length);
    const bool src_done = !reads || covered.Covers(move.source->offset, move.source->length);
    if (dst_done && src_done) break;
  }
}

void RangeOrder::Unlist(Id id, const Move& move) {
  const std::string sb = BufferKey(*move.source);
  const std::string db = BufferKey(*move.destination);
  for (const std::string* b : {&sb, &db}) {
    if (b == &db && db == sb) break;
    auto it = by_buffer_.find(*b);
    if (it == by_buffer_.end()) continue;
    std::vector<Touch>& v = it->second;
    v.erase(std::remove_if(v.begin(), v.end(), [id](const Touch& t) { return t.id == id; }),
            v.end());
    if (v.empty()) by_buffer_.erase(it);
  }
}

void RangeOrder::End(Id id, std::vector<Id>& ready) {
  auto found = moves_.find(id);
  if (found == moves_.end() || found->second.ended) return;
  Move& move = found->second;
  move.ended = true;
  Unlist(id, move);
  // Its ranges are not read again: a move is looked at through by_buffer_ only.
  move.source = move.destination = nullptr;
  move.pieces = nullptr;
  move.spans.reset();
  if (move.pending > 0) return;
  std::vector<Id> ending = {id};
  while (!ending.empty()) {
    const Id t = ending.back();
    ending.pop_back();
    auto it = moves_.find(t);
    std::vector<Id> dependents = std::move(it->second.dependents);
    moves_.erase(it);
    for (const Id d : dependents) {
      Move& next = moves_.at(d);
      if (--next.pending > 0) continue;
      if (next.ended) {
        ending.push_back(d);
      } else {
        ready.push_back(d);
      }
    }
  }
}

int RangeOrder::waits_for(Id id) const {
  auto it = moves_.find(id);
  return it == moves_.end() ? 0 : it->second.pending;
}

}  // namespace gpumove
