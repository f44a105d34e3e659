#include "daemon/path/cuda_ipc/cuda_ipc_tails.h"

#include <algorithm>

namespace gpumove {

absl::Status IpcTailReader::Wait(const BufferUse& range, const AckTail& tail, absl::Time arrived,
                                 absl::Time deadline) {
  if (gpu_->devices().empty()) {
    return absl::FailedPreconditionError("this node has no GPU to wait for it with");
  }
  // The event is opened on the held range's GPU (a host range: the first GPU).
  const int device =
      range.kind() == MemoryKind::kDevice ? range.device() : gpu_->devices().front().index;
  if (deadline == absl::InfinitePast()) return gpu_->WaitIpcFence(device, tail.token, deadline);
  const absl::Time quiet_until =
      quiet_rate_ == 0 || tail.bytes == 0
          ? absl::InfinitePast()
          : arrived + absl::Seconds(static_cast<double>(std::min(tail.bytes, range.length())) /
                                    static_cast<double>(quiet_rate_));
  return gpu_->WaitIpcFence(device, tail.token, deadline, quiet_until);
}

}  // namespace gpumove
