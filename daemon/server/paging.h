// Pages of a listing (ListBuffers, ListTransfers, ListPreparedPieces): no response grows
// past kMaxPageItems entries or about kMaxPageBytes, whatever a tenant keeps, so no answer
// can reach gRPC's message limit or protobuf's 2 GB (which aborts the serializer).
//
// A page token names the last entry served — its time and id, the listing's sort key — so
// entries made or removed between pages neither repeat nor shift the ones after. Tokens
// are opaque to clients and checked as any input: one this node could not have made is
// INVALID_ARGUMENT.
#ifndef GPUMOVE_DAEMON_SERVER_PAGING_H_
#define GPUMOVE_DAEMON_SERVER_PAGING_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace gpumove {

inline constexpr uint32_t kMaxPageItems = 1000;
inline constexpr size_t kMaxPageBytes = 4 << 20;
inline constexpr size_t kMaxPageToken = 256;

// Where an entry sorts: by time, then id.
struct PageKey {
  absl::Time time;
  std::string id;
  bool operator<(const PageKey& o) const { return std::tie(time, id) < std::tie(o.time, o.id); }
};

std::string PageToken(const PageKey& last);
// The key a token names; nullopt for "" (the first page); INVALID_ARGUMENT for a token
// this node could not have made.
absl::StatusOr<std::optional<PageKey>> ParsePageToken(absl::string_view token);
// The entries a page holds when the caller asks for `asked` (0: the most).
uint32_t PageItems(uint32_t asked);

// Fills one page from `items`, sorted by `key` ascending (`newest_first`: descending),
// starting after the token's entry: `add(item)` adds one and returns its encoded size.
// Stops at `max_items` entries or once kMaxPageBytes are reached (a page has at least one
// entry). Returns the next page's token, "" after the last entry.
template <class T, class Key, class Add>
absl::StatusOr<std::string> FillPage(const std::vector<T>& items, absl::string_view token,
                                     uint32_t max_items, bool newest_first, Key key, Add add) {
  auto after = ParsePageToken(token);
  if (!after.ok()) return after.status();
  size_t i = 0;
  if (after->has_value()) {
    const PageKey& last = **after;
    while (i < items.size() && (newest_first ? !(key(items[i]) < last) : !(last < key(items[i])))) {
      ++i;
    }
  }
  size_t n = 0, bytes = 0;
  for (; i < items.size() && n < max_items && bytes < kMaxPageBytes; ++i, ++n) {
    bytes += add(items[i]);
  }
  return i < items.size() && n > 0 ? PageToken(key(items[i - 1])) : std::string();
}

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_PAGING_H_
