#include "daemon/cluster/piece_list.h"

#include "absl/strings/str_cat.h"

namespace gpumove {

absl::StatusOr<PieceListView> PieceListView::Of(
    const google::protobuf::RepeatedField<uint64_t>& offsets,
    const google::protobuf::RepeatedField<uint64_t>& lengths, const peer::v1::PieceList* fixed,
    size_t max_pieces, bool fixed_width_read) {
  PieceListView v;
  const bool has_fixed = fixed != nullptr && (fixed->offsets_size() > 0 ||
                                              fixed->lengths_size() > 0 || fixed->length() != 0);
  if (has_fixed && (!offsets.empty() || !lengths.empty())) {
    return absl::InvalidArgumentError("pieces in both forms");
  }
  if (has_fixed && !fixed_width_read) {
    return absl::InvalidArgumentError(
        "this node reads piece lists only as varint pairs (--peer_fixed_width_pieces=false)");
  }
  if (has_fixed) {
    if (fixed->lengths_size() > 0 && fixed->length() != 0) {
      return absl::InvalidArgumentError("piece lengths given both per piece and for all");
    }
    if (fixed->lengths_size() > 0 && fixed->lengths_size() != fixed->offsets_size()) {
      return absl::InvalidArgumentError(absl::StrCat(fixed->offsets_size(), " piece offsets and ",
                                                     fixed->lengths_size(), " lengths"));
    }
    if (fixed->lengths_size() == 0 && fixed->length() == 0) {
      return absl::InvalidArgumentError("pieces without lengths");
    }
    v.size_ = static_cast<size_t>(fixed->offsets_size());
    v.offsets_ = fixed->offsets().data();
    v.lengths_ = fixed->lengths_size() > 0 ? fixed->lengths().data() : nullptr;
    v.length_ = fixed->length();
  } else {
    if (offsets.size() != lengths.size()) {
      return absl::InvalidArgumentError("piece_offsets and piece_lengths differ in length");
    }
    v.size_ = static_cast<size_t>(offsets.size());
    v.offsets_ = offsets.data();
    v.lengths_ = lengths.data();
  }
  if (v.size_ > max_pieces) {
    return absl::InvalidArgumentError(
        absl::StrCat(v.size_, " pieces in one call; at most ", max_pieces));
  }
  return v;
}

}  // namespace gpumove
