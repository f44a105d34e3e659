// The helpers of start_facts.h: plain functions of the options and the host.
#include "daemon/app/start_facts.h"

#include <unistd.h>

#include "absl/strings/match.h"

namespace gpumove {

bool ClientsNeedCredentials(const ServeOptions& serve) {
  return !serve.auth_tokens.empty() || !serve.tls.client_ca.empty() ||
         !serve.unix_socket_principals.empty();
}

bool OnThisHostOnly(const std::string& a) {
  return absl::StartsWith(a, "unix:") || absl::StartsWith(a, "127.") ||
         absl::StartsWith(a, "[::1]:") || absl::StartsWith(a, "localhost:");
}

std::string UcxNetDevices(const std::string& setting, const std::vector<std::string>& listen) {
  if (setting != "auto") return setting;
  for (const std::string& a : listen) {
    if (!OnThisHostOnly(a)) return "";
  }
  return "lo";
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

}  // namespace gpumove
