#include "daemon/server/convert.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/common/quote.h"

namespace gpumove {

v1::TransferState ToProto(TransferState state) {
  switch (state) {
    case TransferState::kQueued:
      return v1::QUEUED;
    case TransferState::kRunning:
      return v1::RUNNING;
    case TransferState::kSucceeded:
      return v1::SUCCEEDED;
    case TransferState::kFailed:
      return v1::FAILED;
    case TransferState::kCancelled:
      return v1::CANCELLED;
  }
  return v1::TRANSFER_STATE_UNSPECIFIED;
}

absl::StatusOr<TransferState> FromProto(v1::TransferState state) {
  switch (state) {
    case v1::QUEUED:
      return TransferState::kQueued;
    case v1::RUNNING:
      return TransferState::kRunning;
    case v1::SUCCEEDED:
      return TransferState::kSucceeded;
    case v1::FAILED:
      return TransferState::kFailed;
    case v1::CANCELLED:
      return TransferState::kCancelled;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown transfer state ", state));
  }
}

v1::Priority ToProto(Priority p) {
  switch (p) {
    case Priority::kLatency:
      return v1::LATENCY;
    case Priority::kNormal:
      return v1::NORMAL;
    case Priority::kBulk:
      return v1::BULK;
  }
  return v1::NORMAL;
}

absl::StatusOr<Priority> FromProto(v1::Priority p) {
  switch (p) {
    case v1::LATENCY:
      return Priority::kLatency;
    case v1::PRIORITY_UNSPECIFIED:
    case v1::NORMAL:
      return Priority::kNormal;
    case v1::BULK:
      return Priority::kBulk;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown priority ", static_cast<int>(p), " (LATENCY, NORMAL or BULK)"));
  }
}

absl::StatusOr<absl::Duration> FromProto(const google::protobuf::Duration& d) {
  if (d.seconds() < 0 || d.nanos() < 0 || d.nanos() >= 1000000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad duration ", d.seconds(), "s ", d.nanos(), "ns"));
  }
  // Leases, waits and intervals past a year are slips (a lease of 2^62 s was accepted).
  constexpr int64_t kMaxSeconds = 366 * 24 * 3600;
  if (d.seconds() > kMaxSeconds) {
    return absl::InvalidArgumentError(
        absl::StrCat("duration ", d.seconds(), "s is longer than the most, 366 days"));
  }
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

void ToProto(absl::Time t, google::protobuf::Timestamp* out) {
  if (t == absl::InfinitePast() || t == absl::InfiniteFuture()) return;
  const int64_t ns = absl::ToUnixNanos(t);
  out->set_seconds(ns / 1000000000);
  out->set_nanos(static_cast<int32_t>(ns % 1000000000));
}

RangeSpec FromProto(const v1::BufferRef& ref) {
  return RangeSpec{ref.node(), ref.buffer_id(), ref.offset(), ref.length()};
}

void ToProto(const RangeSpec& range, v1::BufferRef* out) {
  out->set_node(range.node);
  out->set_buffer_id(range.buffer_id);
  out->set_offset(range.offset);
  out->set_length(range.length);
}

void ToProto(const BufferInfo& info, const std::string& node, v1::Buffer* out) {
  out->set_id(info.id);
  out->set_node(node);
  out->set_size(info.size);
  out->set_kind(ToProto(info.kind));
  out->set_device(info.device);
  out->set_owner(info.owner);
  out->set_label(info.label);
  ToProto(info.create_time, out->mutable_create_time());
  if (info.lease_expire_time.has_value()) {
    ToProto(*info.lease_expire_time, out->mutable_lease_expire_time());
  }
  out->set_active_uses(info.active_uses);
  out->set_imported(info.imported);
  out->set_exportable(info.exportable);
  out->set_owner_pid(info.owner_pid);
  if (info.file != nullptr) {
    out->set_file_root(info.file->root());
    out->set_file_path(info.file->path());
    out->set_file_offset(info.file->offset());
    out->set_file_writable(info.file->writable());
  }
}

void ToProto(const TransferSnapshot& t, v1::Transfer* out) {
  out->set_id(t.id);
  ToProto(t.source, out->mutable_source());
  ToProto(t.destination, out->mutable_destination());
  out->set_length(t.length);
  out->set_pieces(t.pieces);
  out->set_path(ToProto(t.path));
  out->set_state(ToProto(t.state));
  out->set_bytes_done(t.bytes_done);
  out->set_owner(t.owner);
  out->set_node(t.node);
  out->set_label(t.label);
  ToProto(t.create_time, out->mutable_create_time());
  ToProto(t.start_time, out->mutable_start_time());
  ToProto(t.end_time, out->mutable_end_time());
  if (!t.status.ok()) {
    out->set_error_code(static_cast<int32_t>(t.status.code()));
    out->set_error_message(Bounded(t.status.message()));
  }
  out->set_checksum(t.checksum);
  out->set_durable(t.durable);
  out->set_source_xxh3(t.source_xxh3);
  out->set_destination_xxh3(t.destination_xxh3);
  out->set_idempotency_key(t.idempotency_key);
  out->set_cancel_requested(t.cancel_requested && !IsTerminal(t.state));
  out->set_transport(t.carrier);
  out->set_priority(ToProto(t.priority));
  out->set_waits_for(static_cast<uint32_t>(std::max(0, t.waits_for)));
}

}  // namespace gpumove
