// One transfer as the scheduler keeps it: made and held by HoldPlanner, then queued, run
// and ended by TransferScheduler. Internal to the scheduler.
#ifndef GPUMOVE_DAEMON_CORE_TRANSFER_RECORD_H_
#define GPUMOVE_DAEMON_CORE_TRANSFER_RECORD_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "daemon/core/buffer_registry.h"
#include "daemon/core/engine.h"
#include "daemon/core/range_order.h"
#include "daemon/core/segments.h"
#include "daemon/core/transfer_scheduler.h"

namespace gpumove {

struct TransferRecord {
  // Fixed at Submit.
  std::string id;
  std::string owner;
  std::string label;
  std::string idempotency_key;
  Priority priority = Priority::kNormal;
  std::string require_transport;  // TransferSpec::require_transport.
  RangeSpec source;
  RangeSpec destination;
  uint64_t length = 0;
  // A vectored move's pieces, relative to the ranges held (src.data, dst.data); let go
  // when it ends (a finished move is kept as a record, its list of up to megabytes not).
  std::shared_ptr<const Segments> pieces;
  size_t piece_count = 0;
  PathKind path = PathKind::kAuto;
  bool checksum = false;
  bool durable = false;  // Into a file: fdatasync before it ends.
  std::optional<std::string> notify;
  Engine* engine = nullptr;
  Endpoint src;
  Endpoint dst;
  absl::Time create_time;
  // The end of the move on another node, if any (src.remote or dst.remote points here).
  std::optional<RemoteHold> remote_hold;
  bool remote_completed = false;  // Complete was called (by the worker, before finishing).
  // The end of a copy the move left running (MoveControl::KeepRunning): the other node
  // waits for it before acknowledging; dropped (which waits for it) before the end.
  std::unique_ptr<MoveTail> tail;

  // Owned by the scheduler's lock.
  TransferState state = TransferState::kQueued;
  BufferUse src_use;
  BufferUse dst_use;
  absl::Time start_time = absl::InfinitePast();
  absl::Time end_time = absl::InfinitePast();
  absl::Status status;
  uint64_t source_xxh3 = 0;
  uint64_t destination_xxh3 = 0;
  uint64_t version = 0;
  RangeOrder::Id order = 0;  // Its place in the scheduler's order_.
  std::string carrier;       // MoveControl::Carried.

  // Written by the worker without the lock.
  std::atomic<uint64_t> bytes_done{0};
  std::atomic<bool> cancel_requested{false};
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_CORE_TRANSFER_RECORD_H_
