// The machine-dependent defaults of DaemonOptions, picked in one place from the CPU count.
#include <algorithm>

#include "daemon/app/options.h"

namespace gpumove {

DaemonOptions WithMachineDefaults(DaemonOptions o, unsigned cpus) {
  // A large machine (16 CPUs or more) has CPUs to spare for polling; on a small one a
  // thread that polls takes the CPU from the threads doing the work.
  const bool large = cpus >= 16;
  const int n = static_cast<int>(std::max(1u, cpus));
  const absl::Duration zero = absl::ZeroDuration();
  // An idle pool thread looks for its next piece this long before it sleeps.
  if (o.pool_spin < zero) o.pool_spin = large ? absl::Milliseconds(1) : zero;
  UcxOptions& ucx = o.ucx.transport;
  ucx.poll_window = std::max(ucx.poll_window, zero);
  // Threads serving peer calls poll a fifth as long on a small machine: long enough for
  // the acknowledgement of a small move to find one awake, short enough not to take the
  // CPU from a long move (TCP on 2 CPUs lost half its speed at 1 ms).
  if (o.ucx.peer_call_poll < zero) {
    o.ucx.peer_call_poll = large ? ucx.poll_window : ucx.poll_window / 5;
  }
  if (ucx.call_awake < zero) ucx.call_awake = large ? absl::Milliseconds(10) : zero;
  if (ucx.direct_threads <= 0) ucx.direct_threads = std::clamp(n / 4, 1, 8);
  // Piece copies: as many threads as LOCAL's host piece copies (the CPUs, at most 8).
  if (ucx.piece_threads <= 0) ucx.piece_threads = std::clamp(n, 1, 8);
  // Lanes carry host moves over the wire only: direct copies stay with the first.
  if (o.ucx.lanes <= 0) o.ucx.lanes = std::clamp(n / 8, 1, 4);
  if (!o.mpi.spin.has_value()) o.mpi.spin = large;
  if (o.serve.max_pollers > 0) {
    o.serve.max_pollers = std::max(o.serve.max_pollers, o.serve.min_pollers);
  }
  o.mpi.transport.spin = *o.mpi.spin;
  return o;
}

}  // namespace gpumove
