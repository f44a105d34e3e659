// What several of Daemon::Start's steps ask of the options and of the host: whether callers
// need credentials, whether an address is this host's only, UCX's devices, the host name.
#ifndef GPUMOVE_DAEMON_APP_START_FACTS_H_
#define GPUMOVE_DAEMON_APP_START_FACTS_H_

#include <string>
#include <vector>

#include "daemon/app/options.h"

namespace gpumove {

// Whether callers of the public services need credentials (tokens or client
// certificates): such a daemon is not open, and takes peers only with a cluster secret.
bool ClientsNeedCredentials(const ServeOptions& serve);

// Whether a --listen address is reachable from this host only (loopback, a unix socket).
bool OnThisHostOnly(const std::string& a);

// The network devices UCX may use (UcxOptions::net_devices) for `setting` and the
// addresses gRPC listens on.
std::string UcxNetDevices(const std::string& setting, const std::vector<std::string>& listen);

std::string HostName();

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_APP_START_FACTS_H_
