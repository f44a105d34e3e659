#include "daemon/common/bytes.h"

#include <cctype>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gpumove {
namespace {

constexpr std::pair<absl::string_view, uint64_t> kSuffixes[] = {
    {"", 1},
    {"b", 1},
    {"k", 1ull << 10},
    {"kib", 1ull << 10},
    {"m", 1ull << 20},
    {"mib", 1ull << 20},
    {"g", 1ull << 30},
    {"gib", 1ull << 30},
    {"t", 1ull << 40},
    {"tib", 1ull << 40},
    {"kb", 1000ull},
    {"mb", 1000ull * 1000},
    {"gb", 1000ull * 1000 * 1000},
    {"tb", 1000ull * 1000 * 1000 * 1000},
};

}  // namespace

absl::StatusOr<uint64_t> ParseBytes(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < text.size() && absl::ascii_isdigit(text[digits])) ++digits;
  uint64_t number = 0;
  if (digits == 0 || !absl::SimpleAtoi(text.substr(0, digits), &number)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("bad size \"%s\": expected a number such as 4096, 64MiB, 1GiB", text));
  }
  const std::string suffix =
      absl::AsciiStrToLower(absl::StripAsciiWhitespace(text.substr(digits)));
  for (const auto& [name, scale] : kSuffixes) {
    if (suffix != name) continue;
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(number, scale, &bytes)) {
      return absl::InvalidArgumentError(absl::StrFormat("size \"%s\" overflows 64 bits", text));
    }
    return bytes;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "bad size suffix in \"%s\": use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB", text));
}

std::string FormatBytes(uint64_t bytes) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  double value = static_cast<double>(bytes);
  while (value >= 1024 && unit < 6) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) return absl::StrFormat("%d B", bytes);
  if (value == static_cast<double>(static_cast<uint64_t>(value))) {
    return absl::StrFormat("%d %s", static_cast<uint64_t>(value), kUnits[unit]);
  }
  return absl::StrFormat("%.2f %s", value, kUnits[unit]);
}

bool AbslParseFlag(absl::string_view text, ByteSize* size, std::string* error) {
  absl::StatusOr<uint64_t> bytes = ParseBytes(text);
  if (!bytes.ok()) {
    *error = std::string(bytes.status().message());
    return false;
  }
  size->bytes = *bytes;
  return true;
}

// The largest binary unit that divides it exactly ("1GiB", "384MiB", "1000"): readable in
// --helpfull, and parsed back to the same value.
std::string AbslUnparseFlag(ByteSize size) {
  constexpr std::pair<uint64_t, const char*> kUnits[] = {
      {uint64_t{1} << 40, "TiB"}, {uint64_t{1} << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}};
  for (const auto& [unit, name] : kUnits) {
    if (size.bytes != 0 && size.bytes % unit == 0) return absl::StrCat(size.bytes / unit, name);
  }
  return absl::StrCat(size.bytes);
}

}  // namespace gpumove
