#include "daemon/common/quote.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace gpumove {

std::string Quoted(absl::string_view text) {
  if (text.size() <= kQuotedMax) return absl::StrCat("\"", absl::CHexEscape(text), "\"");
  return absl::StrCat("\"", absl::CHexEscape(text.substr(0, kQuotedMax)), "…\" (", text.size(),
                      " bytes)");
}

std::string Bounded(absl::string_view message, size_t max) {
  if (message.size() <= max) return std::string(message);
  size_t cut = max;
  // Back off continuation bytes (10xxxxxx) so the head stays valid UTF-8.
  while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(message.substr(0, cut), "… (", message.size() - cut, " more bytes)");
}

}  // namespace gpumove
