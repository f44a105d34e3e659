// Path CUDA_IPC's tails as the holding node reads them: a runner's copy into or out of a
// range held here may still run when its acknowledgement comes; its token is the CUDA IPC
// event handle the copy records, which this node opens and waits on before the hold ends.
#ifndef GPUMOVE_DAEMON_PATH_CUDA_IPC_TAILS_H_
#define GPUMOVE_DAEMON_PATH_CUDA_IPC_TAILS_H_

#include <cstdint>
#include <string>

#include "daemon/gpu/gpu.h"
#include "daemon/peer/path_holder.h"

namespace gpumove {

class IpcTailReader : public TailReader {
 public:
  // `gpu` must outlive this. `quiet_rate`: the fastest a runner's CUDA IPC copy can land
  // here, bytes per second: a tail with L bytes behind it (as the runner says, at most the
  // range) is not queried before L / this after the acknowledgement came (the copy was
  // queued before it was sent), so the driver is left alone while the copy runs. 0: query
  // at once.
  IpcTailReader(GpuRuntime* gpu, uint64_t quiet_rate) : gpu_(gpu), quiet_rate_(quiet_rate) {}

  bool Knows(const std::string& token) const override { return gpu_->KnowsIpcFence(token); }
  // FAILED_PRECONDITION on a node without GPUs; the driver's refusal of a bad handle.
  absl::Status Wait(const BufferUse& range, const AckTail& tail, absl::Time arrived,
                    absl::Time deadline) override;

 private:
  GpuRuntime* const gpu_;
  const uint64_t quiet_rate_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_CUDA_IPC_TAILS_H_
