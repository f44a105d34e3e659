#include "daemon/core/quotas.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/common/bytes.h"
#include "daemon/core/buffer_registry.h"

namespace gpumove {

absl::StatusOr<absl::flat_hash_map<std::string, QuotaLimits>> ParseQuotaFile(
    absl::string_view text) {
  absl::flat_hash_map<std::string, QuotaLimits> out;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    std::vector<absl::string_view> f = absl::StrSplit(line, ',');
    if (f.size() != 5) {
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", number, ": ", f.size(), " fields, not 5 (tenant,host,pinned,device,transfers)"));
    }
    for (absl::string_view& v : f) v = absl::StripAsciiWhitespace(v);
    if (f[0].empty())
      return absl::InvalidArgumentError(absl::StrCat("line ", number, ": no tenant"));
    QuotaLimits q;
    for (int k = 0; k < 3; ++k) {
      if (f[1 + k] == "-") continue;
      auto b = ParseBytes(f[1 + k]);
      if (!b.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("line ", number, ": ", b.status().message()));
      }
      q.bytes[k] = *b;
    }
    if (f[4] != "-") {
      uint64_t n = 0;
      if (!absl::SimpleAtoi(f[4], &n)) {
        return absl::InvalidArgumentError(
            absl::StrCat("line ", number, ": transfers \"", f[4], "\" is not a count or -"));
      }
      q.transfers = n;
    }
    if (!out.emplace(std::string(f[0]), q).second) {
      return absl::InvalidArgumentError(absl::StrCat("line ", number, ": tenant ", f[0], " again"));
    }
  }
  return out;
}

void Quotas::Set(absl::flat_hash_map<std::string, QuotaLimits> limits) {
  absl::MutexLock lock(&mu_);
  limits_ = std::move(limits);
}

const QuotaLimits* Quotas::LimitsLocked(const std::string& owner) const {
  if (owner == kAnyOwner) return nullptr;
  auto it = limits_.find(owner);
  if (it == limits_.end()) it = limits_.find("*");
  return it == limits_.end() ? nullptr : &it->second;
}

absl::Status Quotas::Charge(const std::string& owner, MemoryKind kind, uint64_t bytes) {
  const int k = static_cast<int>(kind);
  if (kind == MemoryKind::kFile) return absl::OkStatus();  // Pools' kinds only.
  absl::MutexLock lock(&mu_);
  const QuotaLimits* q = LimitsLocked(owner);
  uint64_t& used = used_[owner][k];
  if (q != nullptr && q->bytes[k].has_value() &&
      (bytes > *q->bytes[k] || used > *q->bytes[k] - bytes)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tenant ", owner, " would hold ", FormatBytes(used + bytes), " of ",
                     MemoryKindName(kind), " memory here; its quota is ", FormatBytes(*q->bytes[k]),
                     " (", FormatBytes(used), " in use)"));
  }
  used += bytes;
  return absl::OkStatus();
}

void Quotas::Uncharge(const std::string& owner, MemoryKind kind, uint64_t bytes) {
  if (kind == MemoryKind::kFile) return;
  absl::MutexLock lock(&mu_);
  auto it = used_.find(owner);
  if (it == used_.end()) return;
  uint64_t& used = it->second[static_cast<int>(kind)];
  used -= std::min(used, bytes);
}

std::optional<uint64_t> Quotas::TransferLimit(const std::string& owner) const {
  absl::MutexLock lock(&mu_);
  const QuotaLimits* q = LimitsLocked(owner);
  return q != nullptr ? q->transfers : std::nullopt;
}

uint64_t Quotas::used(const std::string& owner, MemoryKind kind) const {
  if (kind == MemoryKind::kFile) return 0;
  absl::MutexLock lock(&mu_);
  auto it = used_.find(owner);
  return it == used_.end() ? 0 : it->second[static_cast<int>(kind)];
}

}  // namespace gpumove
