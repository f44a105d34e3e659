// The process-wide setup of process.h: heap thresholds, open files, CPU binding.
#include "daemon/app/process.h"

#include <malloc.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>

#include "daemon/common/cpus.h"
#include "daemon/common/log.h"
#include "daemon/path/mpi/mpi_transport.h"

namespace gpumove {

void TuneHeap() {
  // Requests' big buffers (a Submit of 65536 blocks parses and expands ~3 MB) come from
  // memory the heap keeps rather than fresh pages from the kernel each time, a fault a
  // page (docs/performance/tuning.md, "Vectored moves").
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

void RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t before = limit.rlim_cur;
  if (limit.rlim_cur == limit.rlim_max) {
    LOG(INFO) << "open files: at most " << limit.rlim_cur;
    return;
  }
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    LOG(WARNING) << "open files: cannot raise the limit of " << before << " to " << limit.rlim_max
                 << ": " << std::strerror(errno);
    return;
  }
  LOG(INFO) << "open files: at most " << limit.rlim_cur << " (raised from " << before << ")";
}

void WidenMpiCpuBinding(bool keep) {
  if (const int bound = AllowedCpus(); MpiTransport::LaunchedByMpi() && !keep) {
    auto all = AllowAllCpus();
    if (!all.ok()) {
      LOG(WARNING) << "the MPI launcher bound this rank to " << bound
                   << " CPU(s); cannot widen it: " << all.status();
    } else if (*all != bound) {
      LOG(INFO) << "the MPI launcher bound this rank to " << bound << " CPU(s); its threads now "
                << "run on all " << *all << " (--keep_cpu_binding keeps the launcher's)";
    }
  }
}

}  // namespace gpumove
