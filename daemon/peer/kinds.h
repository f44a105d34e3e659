// Memory kinds and paths on the wire (gpumove.v1 enums, which the peer protocol uses
// too): the one place they are translated. An unknown value is INVALID_ARGUMENT, never
// taken for another.
#ifndef GPUMOVE_DAEMON_PEER_KINDS_H_
#define GPUMOVE_DAEMON_PEER_KINDS_H_

#include "absl/status/statusor.h"
#include "daemon/core/engine.h"
#include "daemon/memory/pool.h"
#include "proto/gpumove/v1/gpumove.pb.h"

namespace gpumove {

absl::StatusOr<MemoryKind> FromProto(v1::MemoryKind kind);
v1::MemoryKind ToProto(MemoryKind kind);
absl::StatusOr<PathKind> FromProto(v1::Path path);
v1::Path ToProto(PathKind path);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PEER_KINDS_H_
