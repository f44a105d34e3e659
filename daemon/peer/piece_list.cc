#include "daemon/peer/piece_list.h"

#include "absl/strings/str_cat.h"

namespace gpumove {

absl::StatusOr<PieceListView> PieceListView::Of(const peer::v1::PieceList& list,
                                                size_t max_pieces) {
  PieceListView v;
  if (list.offsets_size() == 0 && list.lengths_size() == 0 && list.length() == 0) return v;
  if (list.lengths_size() > 0 && list.length() != 0) {
    return absl::InvalidArgumentError("piece lengths given both per piece and for all");
  }
  if (list.lengths_size() > 0 && list.lengths_size() != list.offsets_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(list.offsets_size(), " piece offsets and ", list.lengths_size(), " lengths"));
  }
  if (list.lengths_size() == 0 && list.length() == 0) {
    return absl::InvalidArgumentError("pieces without lengths");
  }
  v.size_ = static_cast<size_t>(list.offsets_size());
  v.offsets_ = list.offsets().data();
  v.lengths_ = list.lengths_size() > 0 ? list.lengths().data() : nullptr;
  v.length_ = list.length();
  if (v.size_ > max_pieces) {
    return absl::InvalidArgumentError(
        absl::StrCat(v.size_, " pieces in one call; at most ", max_pieces));
  }
  return v;
}

}  // namespace gpumove
