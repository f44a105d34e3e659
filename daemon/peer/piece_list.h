// Pieces of a held range as the peer calls carry them: a `PieceList` of fixed-width
// arrays, which protobuf reads in one copy per array.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "proto/gpumove/peer/v1/peer.pb.h"

namespace gpumove {

// Writes n pieces (offset_of(i), length_of(i)) into `list`; one length for every piece
// is sent once.
template <class OffsetOf, class LengthOf>
void EncodePieces(size_t n, OffsetOf offset_of, LengthOf length_of, peer::v1::PieceList* list) {
  if (n == 0) return;
  const uint64_t first = length_of(0);
  bool uniform = true;
  auto* fo = list->mutable_offsets();
  fo->Resize(static_cast<int>(n), 0);
  uint64_t* o = fo->mutable_data();
  for (size_t i = 0; i < n; ++i) {
    o[i] = offset_of(i);
    uniform = uniform && length_of(i) == first;
  }
  if (uniform) {
    list->set_length(first);
    return;
  }
  auto* fl = list->mutable_lengths();
  fl->Resize(static_cast<int>(n), 0);
  uint64_t* l = fl->mutable_data();
  for (size_t i = 0; i < n; ++i) l[i] = length_of(i);
}

// A read-only view of a request's pieces.
class PieceListView {
 public:
  // Checks the form (arrays of one length, or one length for all; at most max_pieces
  // pieces; INVALID_ARGUMENT otherwise); not the pieces themselves. The view borrows the
  // arrays. An empty list is no pieces.
  static absl::StatusOr<PieceListView> Of(const peer::v1::PieceList& list, size_t max_pieces);

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
