#include "client/cli/flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, addr, "",
          "gpumoved address, host:port or unix:/path (default: $GPUMOVE_ADDR or 127.0.0.1:7470).");
ABSL_FLAG(bool, json, false, "Print results as JSON.");
ABSL_FLAG(std::string, kind, "host", "alloc: memory kind, host | pinned | device.");
ABSL_FLAG(int, gpu, 0, "alloc: GPU index for --kind=device.");
ABSL_FLAG(absl::Duration, lease, absl::ZeroDuration(), "alloc/renew: lease TTL (e.g. 30s).");
ABSL_FLAG(std::string, label, "", "alloc/move: a label shown in listings.");
ABSL_FLAG(bool, exportable, false,
          "alloc: a device buffer in a GPU allocation of its own, which export can map.");
ABSL_FLAG(std::string, node, "",
          "alloc/ls: another node of the cluster (default: the one --addr is).");
ABSL_FLAG(std::string, offset, "0", "read/write: offset into the buffer (size suffixes work).");
ABSL_FLAG(std::string, length, "0", "read/move: bytes (0: to the end of the buffer).");
ABSL_FLAG(bool, checksum, false, "move: verify with xxh3 on both sides (DATA_LOSS on mismatch).");
ABSL_FLAG(bool, wait, true,
          "move, cancel: wait for the end (--nowait: move prints the id and returns; cancel "
          "answers at once, the move maybe still stopping).");
ABSL_FLAG(std::string, path, "auto", "move: auto | local | cuda_ipc | ucx | mpi.");
ABSL_FLAG(std::string, root, "", "file: one of the node's --file_roots (empty: its only one).");
ABSL_FLAG(bool, writable, false, "file: the region may be moved into.");
ABSL_FLAG(bool, create, false, "file: make the file (mode 0600) when missing (needs --writable).");
ABSL_FLAG(std::string, require, "",
          "move: the transport class the move must run over between hosts (rdma or tcp); "
          "empty: any.");
ABSL_FLAG(std::string, priority, "normal",
          "move: the move's class, latency | normal | bulk (ready moves start by class).");
ABSL_FLAG(std::string, idempotency_key, "", "move: key that makes a retried move safe.");
ABSL_FLAG(std::string, blocks, "",
          "move: a vectored move of the blocks in this file, one \"SRC_INDEX DST_INDEX\" pair a "
          "line (# comments), each --block_size bytes at index x stride.");
ABSL_FLAG(std::string, block_size, "0", "move --blocks: bytes per block (e.g. 4KiB).");
ABSL_FLAG(std::string, source_stride, "0",
          "move --blocks: bytes between source blocks (0: the block size).");
ABSL_FLAG(std::string, destination_stride, "0",
          "move --blocks: bytes between destination blocks (0: the block size).");
ABSL_FLAG(std::string, prepared, "",
          "move: a vectored move of the pieces of this prepared list (gpumovectl prepare).");
ABSL_FLAG(std::optional<std::string>, notify, std::nullopt,
          "move: bytes the destination's node publishes once the move's bytes are there "
          "(see the notifications command).");
ABSL_FLAG(std::string, buffers, "", "notifications: only moves into these buffers (comma list).");
ABSL_FLAG(std::optional<uint64_t>, after, std::nullopt,
          "notifications: resume after this sequence number (0: from the oldest kept); "
          "unset: new ones only.");
ABSL_FLAG(int, count, 0, "notifications: stop after this many (0: until interrupted).");
ABSL_FLAG(std::string, state, "", "transfers: only this state (queued, running, ...).");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(5), "How long to wait for the daemon to answer.");
ABSL_FLAG(std::string, tls_ca, "",
          "TLS: PEM file of the CAs the daemon's certificate is checked against (default "
          "$GPUMOVE_TLS_CA; empty: plaintext).");
ABSL_FLAG(std::string, tls_cert, "", "TLS: this client's certificate (PEM), for mTLS.");
ABSL_FLAG(std::string, tls_key, "", "TLS: this client's private key (PEM), for mTLS.");
ABSL_FLAG(std::string, token_file, "",
          "A file holding the bearer token for a daemon with --auth_tokens (default: "
          "$GPUMOVE_TOKEN, the token itself).");
ABSL_FLAG(std::string, tls_server_name, "",
          "TLS: the name the daemon's certificate must carry (default: the address's host).");
ABSL_FLAG(std::string, gpu_uuid, "", "import: UUID of the GPU holding the memory (GPU-...).");
ABSL_FLAG(int, pid, 0, "import: the process lending the memory (released when it exits).");
