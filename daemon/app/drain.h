// How gpumoved stops: SIGTERM or SIGINT drains the daemon (health NOT_SERVING, new
// transfers refused, running ones given a grace), a second signal cancels every transfer.
#ifndef GPUMOVE_DAEMON_APP_DRAIN_H_
#define GPUMOVE_DAEMON_APP_DRAIN_H_

#include <signal.h>

#include <memory>

#include "absl/time/time.h"
#include "daemon/app/daemon.h"
#include "daemon/server/service_manager.h"

namespace gpumove {

// SIGTERM and SIGINT blocked in this thread and every thread it starts after (they go to
// the one thread that waits for them), SIGPIPE ignored. Call before any thread starts.
sigset_t BlockStopSignals();

// Waits for the first of `signals`, then drains `daemon` (queued and running transfers get
// `grace`) and waits for its server to stop; a second signal meanwhile cancels every
// transfer. Tells `manager` (systemd) that the daemon is stopping.
void ServeUntilSignalled(std::unique_ptr<Daemon>& daemon, const sigset_t& signals,
                         ServiceManager& manager, absl::Duration grace);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_APP_DRAIN_H_
