// Path FILE_IO: moves between host memory and a FILE buffer on the same node. io_uring
// (Debian's liburing) with a bounded queue of chunk-sized reads or writes; O_DIRECT for
// the part of a move whose file offset, memory address and length are 4 KiB aligned, the
// page cache for the rest; pread/pwrite on the move's thread where io_uring is refused
// (detected once, logged once) or forced. The transfer's transport says which ran.
#ifndef GPUMOVE_DAEMON_PATH_FILE_FILE_ENGINE_H_
#define GPUMOVE_DAEMON_PATH_FILE_FILE_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/core/engine.h"

namespace gpumove {

struct FileEngineOptions {
  // Bytes per read or write (rounded down to 4 KiB, at least 4 KiB).
  uint64_t chunk = 1ull << 20;
  // Reads or writes in flight per move (1 to 256).
  unsigned queue_depth = 16;
  // pread/pwrite even where io_uring works.
  bool force_fallback = false;
};

// The alignment O_DIRECT asks of offsets, lengths and memory here.
inline constexpr uint64_t kDirectAlignment = 4096;

class FileEngine : public Engine {
 public:
  explicit FileEngine(FileEngineOptions options);

  PathKind path() const override { return PathKind::kFile; }
  bool ServesFiles() const override { return true; }
  // Host memory (pageable or pinned) and a FILE buffer, both on this node; the file
  // writable when it is the destination.
  absl::Status CanServe(const Endpoint& src, const Endpoint& dst) const override;
  // Chunks in order of offset, at most queue_depth in flight; progress as they complete,
  // cancel between completions (those in flight are waited for). A move into the file
  // is SUCCEEDED with its bytes in the file, and after fdatasync when control.durable().
  absl::Status Move(const Endpoint& src, const Endpoint& dst, uint64_t length,
                    MoveControl& control) override;

  // Whether moves go through io_uring (else pread/pwrite).
  bool uses_io_uring() const { return uring_.load(); }
  // For the start summary: "io_uring, queue depth 16, 1 MiB chunks" or why not.
  std::string Describe() const;

 private:
  struct Piece;
  struct Plan;
  absl::Status RunUring(const Plan& plan, MoveControl& control);
  absl::Status RunPlain(const Plan& plan, MoveControl& control);

  const FileEngineOptions options_;
  std::atomic<bool> uring_{false};
  std::string why_not_;  // Why io_uring is not used (empty when it is).
};

// xxh3-64 of `length` bytes of the file region at `e` (kind kFile), read through the
// page cache in 1 MiB steps.
absl::StatusOr<uint64_t> HashFileRange(const Endpoint& e, uint64_t length);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_FILE_FILE_ENGINE_H_
