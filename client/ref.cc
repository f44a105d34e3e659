#include "client/ref.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "daemon/common/bytes.h"

namespace gpumove {
namespace {

bool ValidName(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!(absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == ':')) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<v1::BufferRef> ParseBufferRef(absl::string_view text) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad buffer reference \"", text, "\": ", why, " (expected [node/]buffer_id[@offset])"));
  };
  v1::BufferRef ref;
  absl::string_view rest = text;
  if (const size_t at = rest.find('@'); at != absl::string_view::npos) {
    auto offset = ParseBytes(rest.substr(at + 1));
    if (!offset.ok()) return bad(offset.status().message());
    ref.set_offset(*offset);
    rest = rest.substr(0, at);
  }
  if (const size_t slash = rest.find('/'); slash != absl::string_view::npos) {
    const absl::string_view node = rest.substr(0, slash);
    if (!ValidName(node)) return bad("empty or malformed node name");
    ref.set_node(std::string(node));
    rest = rest.substr(slash + 1);
  }
  if (!ValidName(rest)) return bad("empty or malformed buffer id");
  ref.set_buffer_id(std::string(rest));
  return ref;
}

std::string FormatBufferRef(const v1::BufferRef& ref) {
  std::string out = ref.node().empty() ? "" : absl::StrCat(ref.node(), "/");
  absl::StrAppend(&out, ref.buffer_id());
  if (ref.offset() != 0 || ref.length() != 0) absl::StrAppend(&out, "@", ref.offset());
  if (ref.length() != 0) absl::StrAppend(&out, "+", ref.length());
  return out;
}

}  // namespace gpumove
