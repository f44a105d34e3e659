#include "daemon/path/ucx/ucx_rails.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace gpumove {
namespace {

bool RailNameOk(const std::string& rail) {
  const size_t colon = rail.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == rail.size()) return false;
  if (rail.size() > 64) return false;
  int port = 0;
  if (!absl::SimpleAtoi(rail.substr(colon + 1), &port) || port < 1 || port > 255) return false;
  return std::all_of(rail.begin(), rail.begin() + colon, [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
  });
}

// A device that helps UCX connect a rail (a netdev such as "eth1", or "DEVICE:PORT").
bool HelperNameOk(absl::string_view name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' ||
           c == '-' || c == ':';
  });
}

// The netdev a RoCE port runs over (its first GID's), or "" (InfiniBand, unknown).
std::string PortNetdev(const std::filesystem::path& port) {
  std::ifstream in(port / "gid_attrs" / "ndevs" / "0");
  std::string line;
  std::getline(in, line);
  line = std::string(absl::StripAsciiWhitespace(line));
  return HelperNameOk(line) ? line : "";
}

}  // namespace

std::string RailNetDevices(const std::string& rail) {
  return absl::StrReplaceAll(rail, {{"+", ","}});
}

std::vector<std::string> ActiveRdmaPorts(const std::string& sysfs) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  std::error_code ec;
  const fs::path root = fs::path(sysfs) / "class" / "infiniband";
  fs::directory_iterator devices(root, ec);
  if (ec) return out;
  size_t seen = 0;
  for (const fs::directory_entry& dev : devices) {
    if (++seen > 256) break;  // Bounded: no machine has that many.
    fs::directory_iterator ports(dev.path() / "ports", ec);
    if (ec) continue;
    for (const fs::directory_entry& port : ports) {
      std::ifstream state(port.path() / "state");
      std::string line;
      std::getline(state, line);
      // "4: ACTIVE"
      if (line.find("ACTIVE") == std::string::npos) continue;
      const std::string rail =
          absl::StrCat(dev.path().filename().string(), ":", port.path().filename().string());
      if (!RailNameOk(rail)) continue;
      const std::string netdev = PortNetdev(port.path());
      out.push_back(netdev.empty() ? rail : absl::StrCat(rail, "+", netdev));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::vector<std::string>> ParseUcxRails(const std::string& flag,
                                                       const std::string& sysfs) {
  if (flag.empty()) return std::vector<std::string>{};
  if (flag == "auto") {
    std::vector<std::string> ports = ActiveRdmaPorts(sysfs);
    if (ports.size() < 2) return std::vector<std::string>{};
    if (ports.size() > kMaxRails) ports.resize(kMaxRails);
    return ports;
  }
  std::vector<std::string> rails = absl::StrSplit(flag, ',');
  if (rails.size() > kMaxRails) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ucx_rails: ", rails.size(), " rails; at most ", kMaxRails));
  }
  for (size_t i = 0; i < rails.size(); ++i) {
    const std::vector<absl::string_view> parts = absl::StrSplit(rails[i], '+');
    if (parts.size() > 4 || !RailNameOk(std::string(parts[0])) ||
        !std::all_of(parts.begin() + 1, parts.end(), HelperNameOk)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--ucx_rails: rail ", i + 1,
          " is not DEVICE:PORT[+HELPER...] (e.g. mlx5_0:1, or rxe1:1+eth1)"));
    }
    if (std::find(rails.begin(), rails.begin() + i, rails[i]) != rails.begin() + i) {
      return absl::InvalidArgumentError(
          absl::StrCat("--ucx_rails: ", rails[i], " is named twice"));
    }
  }
  return rails;
}

}  // namespace gpumove
