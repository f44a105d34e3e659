// Memory UCX allocates (host pools in shared memory) and registrations (rkeys).
#include <sys/mman.h>
#include <ucp/api/ucp.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "daemon/path/ucx/ucx_transport_impl.h"

namespace gpumove {

using ucx_internal::FindMapping;
using ucx_internal::UcxError;

namespace ucx_internal {

bool FindMapping(uintptr_t address, uintptr_t* lo, uintptr_t* hi, std::string* line) {
  std::ifstream maps("/proc/self/maps");
  while (std::getline(maps, *line)) {
    if (sscanf(line->c_str(), "%lx-%lx", lo, hi) == 2 && *lo <= address && address < *hi) {
      return true;
    }
  }
  return false;
}

}  // namespace ucx_internal

absl::StatusOr<void*> UcxTransport::Allocate(uint64_t length) {
  absl::StatusOr<void*> result;
  impl_->Call([&] {
    ucp_mem_map_params_t params = {};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                        UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    params.address = nullptr;
    params.length = length;
    params.flags = UCP_MEM_MAP_ALLOCATE;
    ucp_mem_h memh = nullptr;
    ucs_status_t st = ucp_mem_map(impl_->context, &params, &memh);
    if (st != UCS_OK) {
      result = UcxError(st, "ucp_mem_map (allocate)");
      return;
    }
    ucp_mem_attr_t attr = {};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    st = ucp_mem_query(memh, &attr);
    if (st != UCS_OK || attr.length < length) {
      ucp_mem_unmap(impl_->context, memh);
      result = st != UCS_OK ? UcxError(st, "ucp_mem_query")
                            : absl::ResourceExhaustedError("UCX allocated too little");
      return;
    }
    impl_->registrations.push_back(memh);
    impl_->allocated[attr.address] = memh;
    result = attr.address;
  });
  // Fault every page in now (off the progress thread), so the first move into a buffer
  // runs at memory speed. The kernel populates the range in one call (it zeroes each page
  // as it adds it); kernels before 5.14 refuse MADV_POPULATE_WRITE, and there a write to
  // every page faults them in one by one.
  if (result.ok() && madvise(*result, length, MADV_POPULATE_WRITE) != 0) {
    memset(*result, 0, length);
  }
  return result;
}

void UcxTransport::Free(void* base) {
  impl_->Call([&] {
    auto it = impl_->allocated.find(base);
    if (it == impl_->allocated.end()) return;
    ucp_mem_h memh = it->second;
    impl_->allocated.erase(it);
    std::erase(impl_->registrations, memh);
    ucp_mem_unmap(impl_->context, memh);
  });
}

std::string UcxTransport::allocation_kind() const {
  // UCX does not say which allocator served a ucp_mem_map; the mapping's name does:
  // "/SYSV<key>" for System V, a file under /dev/shm for POSIX shared memory.
  std::vector<uintptr_t> bases;
  impl_->Call([&] {
    for (const auto& [base, memh] : impl_->allocated) {
      bases.push_back(reinterpret_cast<uintptr_t>(base));
    }
  });
  if (bases.empty()) return "private memory";
  size_t shared = 0;
  for (uintptr_t base : bases) {
    uintptr_t lo = 0, hi = 0;
    std::string line;
    if (FindMapping(base, &lo, &hi, &line) &&
        (line.find("/SYSV") != std::string::npos || line.find("/dev/shm/") != std::string::npos)) {
      ++shared;
    }
  }
  return shared == bases.size() ? "shared memory" : "private memory";
}

absl::StatusOr<std::string> UcxTransport::Register(void* base, uint64_t length) {
  absl::StatusOr<std::string> result;
  impl_->Call([&] {
    ucs_status_t st = UCS_OK;
    ucp_mem_h memh = nullptr;
    if (auto it = impl_->allocated.find(base); it != impl_->allocated.end()) {
      memh = it->second;
    } else {
      ucp_mem_map_params_t params = {};
      params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
      params.address = base;
      params.length = length;
      st = ucp_mem_map(impl_->context, &params, &memh);
      if (st != UCS_OK) {
        result = UcxError(st, "ucp_mem_map");
        return;
      }
      impl_->registrations.push_back(memh);
    }
    void* rkey = nullptr;
    size_t size = 0;
    st = ucp_rkey_pack(impl_->context, memh, &rkey, &size);
    if (st != UCS_OK) {
      result = UcxError(st, "ucp_rkey_pack");
      return;
    }
    result = std::string(static_cast<const char*>(rkey), size);
    ucp_rkey_buffer_release(rkey);
  });
  return result;
}

}  // namespace gpumove
