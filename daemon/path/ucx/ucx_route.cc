#include "daemon/path/ucx/ucx_route.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace gpumove {
namespace {

constexpr size_t kMostLanes = 64;
constexpr size_t kLongestName = 64;

bool CarriesData(const UcxLaneInfo& lane) {
  for (const std::string& r : lane.roles) {
    if (absl::StartsWith(r, "rma") || absl::StartsWith(r, "am_bw")) return true;
  }
  return false;
}

// "5:rc_verbs/rxe0:1.0" -> rc_verbs, rxe0:1 (the resource index before ':' and the path
// index after the last '.' go).
bool ParseResource(absl::string_view word, UcxLaneInfo* lane) {
  const size_t colon = word.find(':');
  if (colon == absl::string_view::npos) return false;
  absl::string_view rest = word.substr(colon + 1);
  const size_t slash = rest.find('/');
  if (slash == absl::string_view::npos || slash == 0) return false;
  absl::string_view tl = rest.substr(0, slash), dev = rest.substr(slash + 1);
  const size_t dot = dev.rfind('.');
  if (dot != absl::string_view::npos) dev = dev.substr(0, dot);
  if (dev.empty() || tl.size() > kLongestName || dev.size() > kLongestName) return false;
  lane->transport = std::string(tl);
  lane->device = std::string(dev);
  return true;
}

}  // namespace

bool UcxRoute::Carries(absl::string_view kind) const {
  for (const std::string& c : carriers) {
    if (UcxTransportClass(c.substr(0, c.find('/'))) == kind) return true;
  }
  return false;
}

std::string UcxRoute::Summary() const { return absl::StrJoin(carriers, ","); }

UcxRoute ParseUcxRoute(absl::string_view text) {
  UcxRoute route;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (route.lanes.size() >= kMostLanes) break;
    line = absl::StripAsciiWhitespace(absl::StripPrefix(line, "#"));
    if (!absl::StartsWith(line, "lane[")) continue;
    const size_t colon = line.find("]:");
    if (colon == absl::string_view::npos) continue;
    std::vector<absl::string_view> words =
        absl::StrSplit(line.substr(colon + 2), ' ', absl::SkipWhitespace());
    UcxLaneInfo lane;
    if (words.empty() || !ParseResource(words[0], &lane)) continue;
    // Roles follow the remote side ("-> md[..]/name/sysdev[..]").
    size_t arrow = 0;
    while (arrow < words.size() && words[arrow] != "->") ++arrow;
    for (size_t i = arrow + 2; i < words.size() && lane.roles.size() < 16; ++i) {
      if (words[i].size() <= kLongestName) lane.roles.emplace_back(words[i]);
    }
    route.lanes.push_back(std::move(lane));
  }
  bool any_data = false;
  for (const UcxLaneInfo& l : route.lanes) any_data = any_data || CarriesData(l);
  for (const UcxLaneInfo& l : route.lanes) {
    if (any_data && !CarriesData(l)) continue;
    std::string c = l.transport + "/" + l.device;
    bool seen = false;
    for (const std::string& s : route.carriers) seen = seen || s == c;
    if (!seen) route.carriers.push_back(std::move(c));
  }
  return route;
}

std::string UcxTransportClass(absl::string_view tl) {
  if (absl::StartsWith(tl, "rc") || absl::StartsWith(tl, "dc") || absl::StartsWith(tl, "ud")) {
    return "rdma";
  }
  if (tl == "tcp") return "tcp";
  if (tl == "sysv" || tl == "posix" || tl == "cma" || tl == "knem" || tl == "xpmem") return "shm";
  if (tl == "cuda_ipc" || tl == "cuda_copy" || tl == "gdr_copy") return "cuda";
  if (tl == "self") return "self";
  return "other";
}

}  // namespace gpumove
