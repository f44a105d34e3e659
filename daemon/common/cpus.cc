#include "daemon/common/cpus.h"

#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace gpumove {
namespace {

// Room for every CPU the kernel may number (CPU_SETSIZE is only 1024).
int MaxCpus() {
  const long configured = sysconf(_SC_NPROCESSORS_CONF);
  return static_cast<int>(std::max<long>(configured, CPU_SETSIZE));
}

struct CpuSetDeleter {
  void operator()(cpu_set_t* s) const { CPU_FREE(s); }
};

}  // namespace

int AllowedCpus() {
  const int n = MaxCpus();
  std::unique_ptr<cpu_set_t, CpuSetDeleter> set(CPU_ALLOC(n));
  const size_t bytes = CPU_ALLOC_SIZE(n);
  CPU_ZERO_S(bytes, set.get());
  if (sched_getaffinity(0, bytes, set.get()) != 0) return 1;
  return CPU_COUNT_S(bytes, set.get());
}

absl::StatusOr<int> AllowAllCpus() {
  const int n = MaxCpus();
  std::unique_ptr<cpu_set_t, CpuSetDeleter> set(CPU_ALLOC(n));
  const size_t bytes = CPU_ALLOC_SIZE(n);
  CPU_ZERO_S(bytes, set.get());
  for (int cpu = 0; cpu < n; ++cpu) CPU_SET_S(cpu, bytes, set.get());
  // The kernel keeps what the cpuset (a container's limit) allows and drops the rest.
  if (sched_setaffinity(0, bytes, set.get()) != 0) {
    return absl::InternalError(absl::StrCat("sched_setaffinity: ", std::strerror(errno)));
  }
  return AllowedCpus();
}

}  // namespace gpumove
