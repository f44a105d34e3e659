#include "daemon/core/qos.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/common/quote.h"

namespace gpumove {

const char* PriorityName(Priority p) {
  switch (p) {
    case Priority::kLatency:
      return "latency";
    case Priority::kNormal:
      return "normal";
    case Priority::kBulk:
      return "bulk";
  }
  return "?";
}

std::optional<Priority> ParsePriority(absl::string_view name) {
  for (Priority p : {Priority::kLatency, Priority::kNormal, Priority::kBulk}) {
    if (name == PriorityName(p)) return p;
  }
  return std::nullopt;
}

absl::StatusOr<absl::flat_hash_map<std::string, uint32_t>> ParseTenantWeights(
    absl::string_view text) {
  absl::flat_hash_map<std::string, uint32_t> out;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::ByAnyChar(", \t"), absl::SkipEmpty());
    if (f.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", number, ": ", f.size(), " fields, not 2 (tenant weight)"));
    }
    uint32_t w = 0;
    if (!absl::SimpleAtoi(f[1], &w) || w < 1 || w > kMaxTenantWeight) {
      return absl::InvalidArgumentError(absl::StrCat("line ", number, ": weight ", Quoted(f[1]),
                                                     " is not an integer from 1 to ",
                                                     kMaxTenantWeight));
    }
    if (out.size() >= kMaxWeightedTenants) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", number, ": more than ", kMaxWeightedTenants, " tenants"));
    }
    if (!out.emplace(std::string(f[0]), w).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", number, ": tenant ", Quoted(f[0]), " again"));
    }
  }
  return out;
}

void TenantWeights::Set(absl::flat_hash_map<std::string, uint32_t> weights) {
  absl::MutexLock lock(&mu_);
  weights_ = std::move(weights);
}

uint32_t TenantWeights::Of(const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = weights_.find(tenant);
  if (it == weights_.end()) it = weights_.find("*");
  return it == weights_.end() ? 1 : it->second;
}

}  // namespace gpumove
