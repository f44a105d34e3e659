// What the scheduler needs from a data-movement engine (a path): whether it can serve a
// pair of memories, and a blocking Move that reports progress and honours cancel.
#ifndef GPUMOVE_DAEMON_CORE_ENGINE_H_
#define GPUMOVE_DAEMON_CORE_ENGINE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "daemon/memory/pool.h"

namespace gpumove {

enum class PathKind { kAuto, kLocal, kCudaIpc, kUcx, kMpi };

const char* PathKindName(PathKind path);

// One side of a move, already checked and held in use.
struct Endpoint {
  char* data = nullptr;
  MemoryKind kind = MemoryKind::kHost;
  int device = kHostDevice;
};

// Given to Move by the scheduler.
class MoveControl {
 public:
  virtual ~MoveControl() = default;
  // True once Cancel was asked for: stop at the next chunk boundary.
  virtual bool cancelled() const = 0;
  // Bytes known to have landed in the destination so far. May block briefly to hold the
  // daemon's rate limit.
  virtual void Progress(uint64_t bytes_done) = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual PathKind path() const = 0;
  // OK when Move can copy from `src` to `dst`; otherwise FAILED_PRECONDITION saying why.
  virtual absl::Status CanServe(const Endpoint& src, const Endpoint& dst) const = 0;
  // Copies `length` bytes and returns when they are visible in dst. CANCELLED when it
  // stopped early because control.cancelled().
  virtual absl::Status Move(const Endpoint& src, const Endpoint& dst, uint64_t length,
                            MoveControl& control) = 0;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_CORE_ENGINE_H_
