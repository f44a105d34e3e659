#include "daemon/common/cpus.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace gpumove {
namespace {

// A CPU set with room for every CPU the kernel may number (CPU_SETSIZE is only 1024).
class CpuSet {
 public:
  CpuSet()
      : n_(static_cast<int>(std::max<long>(sysconf(_SC_NPROCESSORS_CONF), CPU_SETSIZE))),
        bytes_(CPU_ALLOC_SIZE(n_)),
        set_(CPU_ALLOC(n_)) {
    CPU_ZERO_S(bytes_, set_.get());
  }
  void AddAll() {
    for (int cpu = 0; cpu < n_; ++cpu) CPU_SET_S(cpu, bytes_, set_.get());
  }
  int Count() const { return CPU_COUNT_S(bytes_, set_.get()); }
  size_t bytes() const { return bytes_; }
  cpu_set_t* get() { return set_.get(); }

 private:
  struct Free {
    void operator()(cpu_set_t* s) const { CPU_FREE(s); }
  };
  const int n_;
  const size_t bytes_;
  std::unique_ptr<cpu_set_t, Free> set_;
};

}  // namespace

int AllowedCpus() {
  CpuSet set;
  if (sched_getaffinity(0, set.bytes(), set.get()) != 0) return 1;
  return set.Count();
}

absl::StatusOr<int> AllowAllCpus() {
  CpuSet set;
  set.AddAll();
  // The kernel keeps what the cpuset (a container's limit) allows and drops the rest.
  if (sched_setaffinity(0, set.bytes(), set.get()) != 0) {
    return absl::InternalError(absl::StrCat("sched_setaffinity: ", std::strerror(errno)));
  }
  return AllowedCpus();
}

}  // namespace gpumove
