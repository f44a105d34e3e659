#include "daemon/core/range_order.h"

#include <algorithm>
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

}  // namespace

std::string RangeOrder::BufferKey(const RangeSpec& r) {
  return absl::StrCat(r.node, "/", r.buffer_id);
}

bool RangeOrder::Add(Id id, const RangeSpec* source, const RangeSpec* destination) {
  Move& move = moves_[id];
  move.source = source;
  move.destination = destination;
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
    auto consider = [&](bool both_here, const RangeSpec& a, const RangeSpec& b) {
      if (!both_here || !RangesOverlap(a.offset, a.length, b.offset, b.length)) return;
      conflict = true;
      const uint64_t begin = std::max(a.offset, b.offset);
      const uint64_t end = std::min(a.offset + a.length, b.offset + b.length);
      if (!covered.Covers(begin, end - begin)) shielded = false;
    };
    consider(writes && it->writes, *move.destination, *e.destination);
    consider(writes && it->reads, *move.destination, *e.source);
    consider(reads && it->writes, *move.source, *e.destination);
    if (!conflict || shielded) continue;
    // Both of this move's buffers' lists may hold e: the edge is made once (only this
    // move is being added now, so it would be e's last dependent).
    if (e.dependents.empty() || e.dependents.back() != id) {
      e.dependents.push_back(id);
      ++move.pending;
    }
    if (it->writes) covered.Add(e.destination->offset, e.destination->length);
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
