#include "daemon/server/paging.h"

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/common/quote.h"

namespace gpumove {

std::string PageToken(const PageKey& last) {
  return absl::WebSafeBase64Escape(absl::StrCat("p1.", absl::ToUnixNanos(last.time), ".", last.id));
}

absl::StatusOr<std::optional<PageKey>> ParsePageToken(absl::string_view token) {
  if (token.empty()) return std::optional<PageKey>();
  auto refuse = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_token ", Quoted(token),
        " is not one this node gave: pass next_page_token from the previous page as it came"));
  };
  if (token.size() > kMaxPageToken) return refuse();
  std::string text;
  if (!absl::WebSafeBase64Unescape(token, &text) || text.rfind("p1.", 0) != 0) return refuse();
  const size_t dot = text.find('.', 3);
  int64_t nanos = 0;
  if (dot == std::string::npos ||
      !absl::SimpleAtoi(absl::string_view(text).substr(3, dot - 3), &nanos)) {
    return refuse();
  }
  return std::optional<PageKey>(PageKey{absl::FromUnixNanos(nanos), text.substr(dot + 1)});
}

uint32_t PageItems(uint32_t asked) {
  return asked == 0 || asked > kMaxPageItems ? kMaxPageItems : asked;
}

}  // namespace gpumove
