// Pieces of a held range as the peer calls carry them: varint pairs (`piece_offsets`,
// `piece_lengths`, every version) or the fixed-width `PieceList` (nodes that advertise
// `fixed_width_pieces`), which protobuf reads in one copy per array.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "google/protobuf/repeated_field.h"
#include "proto/gpumove/peer/v1/peer.pb.h"

namespace gpumove {

// Writes n pieces (offset_of(i), length_of(i)) into `fixed` (when the receiving node reads
// that form) or into the varint pairs. One length for every piece is sent once.
template <class OffsetOf, class LengthOf>
void EncodePieces(size_t n, OffsetOf offset_of, LengthOf length_of, bool fixed_width,
                  google::protobuf::RepeatedField<uint64_t>* offsets,
                  google::protobuf::RepeatedField<uint64_t>* lengths, peer::v1::PieceList* fixed) {
  if (n == 0) return;
  if (!fixed_width) {
    offsets->Resize(static_cast<int>(n), 0);
    lengths->Resize(static_cast<int>(n), 0);
    uint64_t* o = offsets->mutable_data();
    uint64_t* l = lengths->mutable_data();
    for (size_t i = 0; i < n; ++i) {
      o[i] = offset_of(i);
      l[i] = length_of(i);
    }
    return;
  }
  const uint64_t first = length_of(0);
  bool uniform = true;
  auto* fo = fixed->mutable_offsets();
  fo->Resize(static_cast<int>(n), 0);
  uint64_t* o = fo->mutable_data();
  for (size_t i = 0; i < n; ++i) {
    o[i] = offset_of(i);
    uniform = uniform && length_of(i) == first;
  }
  if (uniform) {
    fixed->set_length(first);
    return;
  }
  auto* fl = fixed->mutable_lengths();
  fl->Resize(static_cast<int>(n), 0);
  uint64_t* l = fl->mutable_data();
  for (size_t i = 0; i < n; ++i) l[i] = length_of(i);
}

// A read-only view of a request's pieces in either form.
class PieceListView {
 public:
  // Checks the form (one of the two, arrays of one length, at most max_pieces pieces;
  // INVALID_ARGUMENT otherwise); not the pieces themselves. The view borrows the arrays.
  // fixed_width_read false: this node does not advertise the fixed-width form, which is
  // refused (as a node of an earlier version would not read it).
  static absl::StatusOr<PieceListView> Of(const google::protobuf::RepeatedField<uint64_t>& offsets,
                                          const google::protobuf::RepeatedField<uint64_t>& lengths,
                                          const peer::v1::PieceList* fixed, size_t max_pieces,
                                          bool fixed_width_read = true);

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  uint64_t offset(size_t i) const { return offsets_[i]; }
  uint64_t length(size_t i) const { return lengths_ != nullptr ? lengths_[i] : length_; }

 private:
  size_t size_ = 0;
  const uint64_t* offsets_ = nullptr;
  const uint64_t* lengths_ = nullptr;  // Null: every piece is length_ long.
  uint64_t length_ = 0;
};

}  // namespace gpumove
