// gpumovectl: the command line for gpumoved.
//
//   gpumovectl [--addr ADDR] [--json] COMMAND ARGS...
//
// Errors print "error: CODE: message" and exit non-zero (2 for usage errors).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/gpumove_client.h"
#include "client/ref.h"
#include "daemon/common/bytes.h"
#include "google/protobuf/util/json_util.h"

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

namespace gpumove {
namespace {

constexpr char kUsage[] =
    R"(gpumovectl: drive a gpumoved daemon.

Usage: gpumovectl [--addr ADDR] [--json] COMMAND [ARGS] [FLAGS]

Commands:
  info                               node, GPUs, pools and paths
  peers                              nodes this one knows
  health [SERVICE]                   gRPC health check (exit 0 when SERVING)
  alloc SIZE [--kind host|pinned|device] [--gpu N] [--lease 30s] [--label L] [--node N]
        [--exportable]               allocate a buffer (on node N); prints its id;
                                     --exportable: a device buffer export can map
  ls [--node N]                      list buffers
  get BUF                            show one buffer
  release BUF                        free a buffer
  renew BUF [--lease TTL]            renew a buffer's lease
  export BUF                         CUDA IPC handle + offset of an exportable device buffer
  import HANDLE_HEX SIZE --gpu_uuid U [--offset N] [--pid P]
                                     lend part of a process's GPU allocation to the daemon
  (BUF is [node/]buffer_id: any node answers for buffers of every node)
  write BUF FILE [--offset N]        copy FILE (- for stdin) into BUF
  read BUF FILE [--offset N] [--length N]
                                     copy bytes of BUF into FILE (- for stdout)
  move SRC DST [--length N] [--checksum] [--no-wait] [--path P] [--notify TEXT]
      [--blocks FILE --block_size N [--source_stride N] [--destination_stride N]]
      [--prepared ID]                copy SRC to DST; refs are [node/]buffer_id[@offset]
  prepare --blocks FILE --block_size N [--source_stride N] [--destination_stride N]
      [--node N] [--label L]         keep a block list on node N for moves to name
                                     (move --prepared ID); prints its id
  prepared [--node N]                list the prepared piece lists
  release-pieces ID                  let a prepared list go
  notifications [--node N] [--buffers B1,B2] [--after SEQ] [--count N]
                                     stream notifications of moves into node N's buffers
  transfers [--state S]              list transfers, newest first
  transfer ID                        show one transfer
  wait ID                            wait for a transfer to end
  cancel ID                          cancel a transfer

Sizes take suffixes: 4KiB, 64MiB, 1GiB. See docs/operations.md for more.)";

// Usage errors exit 2; errors from the daemon exit 1.
struct UsageError {
  std::string message;
};

int Fail(const absl::Status& status) {
  std::cerr << "error: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
            << "\n";
  return 1;
}

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, options);
  return out;
}

std::string Kind(v1::MemoryKind kind, int device) {
  switch (kind) {
    case v1::HOST:
      return "host";
    case v1::PINNED_HOST:
      return "pinned";
    case v1::DEVICE:
      return absl::StrCat("gpu", device);
    default:
      return "?";
  }
}

std::string State(v1::TransferState s) { return v1::TransferState_Name(s); }

std::string Rate(uint64_t bytes, absl::Duration d) {
  const double s = absl::ToDoubleSeconds(d);
  if (s <= 0) return "-";
  return absl::StrFormat("%.2f GB/s", static_cast<double>(bytes) / s / 1e9);
}

absl::Duration Elapsed(const v1::Transfer& t) {
  auto to_time = [](const google::protobuf::Timestamp& ts) {
    return absl::FromUnixSeconds(ts.seconds()) + absl::Nanoseconds(ts.nanos());
  };
  if (!t.has_start_time() || !t.has_end_time()) return absl::ZeroDuration();
  return to_time(t.end_time()) - to_time(t.start_time());
}

uint64_t SizeArg(const std::string& text) {
  auto v = ParseBytes(text);
  if (!v.ok()) throw UsageError{std::string(v.status().message())};
  return *v;
}

// --lease, when given, into a request's lease_ttl.
void SetLease(google::protobuf::Duration* ttl) {
  const absl::Duration lease = absl::GetFlag(FLAGS_lease);
  if (lease <= absl::ZeroDuration()) return;
  const int64_t ns = absl::ToInt64Nanoseconds(lease);
  ttl->set_seconds(ns / 1000000000);
  ttl->set_nanos(static_cast<int32_t>(ns % 1000000000));
}

v1::BufferRef RefArg(const std::string& text) {
  auto r = ParseBufferRef(text);
  if (!r.ok()) throw UsageError{std::string(r.status().message())};
  return *r;
}

// The block list of --blocks FILE (one "SRC_INDEX DST_INDEX" pair a line) with
// --block_size and the strides.
// A local file that could not be opened, in the code its errno means: a missing file or
// folder is NOT_FOUND, a refusal PERMISSION_DENIED.
absl::Status LocalFileError(const std::string& path, int err) {
  const std::string what = absl::StrCat(path, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(what);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(what);
    case EISDIR:
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(what);
    default:
      return absl::UnavailableError(what);
  }
}

v1::BlockList BlocksArg() {
  v1::BlockList b;
  b.set_block_size(SizeArg(absl::GetFlag(FLAGS_block_size)));
  b.set_source_stride(SizeArg(absl::GetFlag(FLAGS_source_stride)));
  b.set_destination_stride(SizeArg(absl::GetFlag(FLAGS_destination_stride)));
  if (b.block_size() == 0) throw UsageError{"--blocks needs --block_size"};
  std::ifstream in(absl::GetFlag(FLAGS_blocks));
  if (!in) throw UsageError{absl::StrCat("cannot read ", absl::GetFlag(FLAGS_blocks))};
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    line = std::string(absl::StripAsciiWhitespace(line.substr(0, line.find('#'))));
    if (line.empty()) continue;
    std::vector<std::string> f = absl::StrSplit(line, absl::ByAnyChar(" \t,"), absl::SkipEmpty());
    uint64_t si = 0, di = 0;
    if (f.size() != 2 || !absl::SimpleAtoi(f[0], &si) || !absl::SimpleAtoi(f[1], &di)) {
      throw UsageError{absl::StrCat(absl::GetFlag(FLAGS_blocks), " line ", number,
                                    ": not \"SRC_INDEX DST_INDEX\"")};
    }
    b.add_source_blocks(si);
    b.add_destination_blocks(di);
  }
  CompactBlockIndices(&b);
  return b;
}

void Need(const std::vector<std::string>& args, size_t n, const char* usage) {
  if (args.size() != n + 1) throw UsageError{absl::StrCat("usage: gpumovectl ", usage)};
}

void PrintTransfer(const v1::Transfer& t) {
  std::cout << absl::StrFormat("%s  %s  %s -> %s  %s  %s", t.id(), State(t.state()),
                               FormatBufferRef(t.source()), FormatBufferRef(t.destination()),
                               FormatBytes(t.length()), v1::Path_Name(t.path()));
  if (t.pieces() > 0) std::cout << "  " << t.pieces() << " pieces";
  if (t.state() == v1::SUCCEEDED) {
    std::cout << absl::StrFormat("  %s  %s", absl::FormatDuration(Elapsed(t)),
                                 Rate(t.length(), Elapsed(t)));
  }
  if (t.error_code() != 0) {
    std::cout << "  " << absl::StatusCodeToString(static_cast<absl::StatusCode>(t.error_code()))
              << ": " << t.error_message();
  }
  if (t.cancel_requested()) std::cout << "  (cancel under way: stops at its next chunk)";
  std::cout << "\n";
}

// Draws "[#####     ] 52%  1.2 GiB / 2 GiB  3.40 GB/s" on stderr.
class ProgressBar {
 public:
  void Draw(const v1::Transfer& t) {
    const double frac = t.length() == 0 ? 1.0 : static_cast<double>(t.bytes_done()) / t.length();
    const int filled = static_cast<int>(frac * 30);
    const absl::Duration elapsed = absl::Now() - start_;
    std::cerr << absl::StrFormat("\r[%s%s] %3d%%  %s / %s  %s  %s   ", std::string(filled, '#'),
                                 std::string(30 - filled, ' '), static_cast<int>(frac * 100),
                                 FormatBytes(t.bytes_done()), FormatBytes(t.length()),
                                 Rate(t.bytes_done(), elapsed), State(t.state()));
    drawn_ = true;
  }
  void End() {
    if (drawn_) std::cerr << "\n";
  }

 private:
  absl::Time start_ = absl::Now();
  bool drawn_ = false;
};

int Run(Client& c, const std::vector<std::string>& args) {
  const std::string& cmd = args[0];
  const bool json = absl::GetFlag(FLAGS_json);

  if (cmd == "info") {
    Need(args, 0, "info");
    auto info = c.GetInfo();
    if (!info.ok()) return Fail(info.status());
    if (json) return std::cout << Json(*info), 0;
    std::cout << "node      " << info->node() << " (host " << info->host() << ", gpumoved "
              << info->version() << ")\n";
    std::cout << "listen    " << absl::StrJoin(info->listen(), ", ") << "\n";
    std::cout << "callers   " << info->authentication()
              << (info->tls() ? (info->tls_client_certificates() ? ", TLS with client certificates"
                                                                 : ", TLS")
                              : ", plaintext")
              << "\n";
    std::cout << "peers     " << info->peer_authentication() << "\n";
    std::cout << "cpus      " << info->cpus() << " (" << info->workers() << " transfer workers)\n";
    std::cout << "gpus      " << info->gpu_status()
              << (info->cuda_compiled() ? "" : " [built without CUDA]") << "\n";
    for (const auto& g : info->gpus()) {
      std::cout << absl::StrFormat("  gpu%d  %s  %s  %s  peers [%s]\n", g.index(), g.name(),
                                   g.uuid(), FormatBytes(g.total_memory()),
                                   absl::StrJoin(g.peer_access(), ","));
    }
    std::cout << "pools\n";
    for (const auto& p : info->pools()) {
      std::cout << absl::StrFormat(
          "  %-7s capacity %-10s free %-10s largest free %-10s buffers %d%s\n",
          Kind(p.kind(), p.device()), FormatBytes(p.capacity()), FormatBytes(p.free()),
          FormatBytes(p.largest_free()), p.buffers(),
          p.kind() == v1::PINNED_HOST && !p.locked() ? " (not locked)" : "");
    }
    std::cout << "paths\n";
    for (const auto& p : info->paths()) {
      std::cout << absl::StrFormat("  %-8s %-3s %s\n",
                                   p.path() == v1::PATH_AUTO ? "AUTO" : v1::Path_Name(p.path()),
                                   p.available() ? "yes" : "no", p.reason());
    }
    std::cout << "active    " << info->active_transfers() << " transfer(s)\n";
    if (!info->metrics_address().empty()) {
      std::cout << "metrics   http://" << info->metrics_address() << "/metrics\n";
    }
    return 0;
  }
  if (cmd == "health") {
    // For container health checks and scripts: exit 0 only when SERVING.
    if (args.size() > 2) Need(args, 1, "health [SERVICE]");
    const absl::Status st = c.Health(args.size() == 2 ? args[1] : "");
    if (!st.ok()) return Fail(st);
    std::cout << "SERVING\n";
    return 0;
  }
  if (cmd == "peers") {
    Need(args, 0, "peers");
    auto peers = c.ListPeers();
    if (!peers.ok()) return Fail(peers.status());
    if (peers->empty()) std::cout << "no peers\n";
    for (const auto& p : *peers) {
      if (json)
        std::cout << Json(p);
      else
        std::cout << absl::StrFormat("%s  %s  %s\n", p.node(), p.address(), p.up() ? "up" : "DOWN");
    }
    return 0;
  }
  if (cmd == "alloc") {
    Need(args, 1, "alloc SIZE [--kind host|pinned|device] [--gpu N]");
    const std::string k = absl::GetFlag(FLAGS_kind);
    v1::MemoryKind kind = k == "host"     ? v1::HOST
                          : k == "pinned" ? v1::PINNED_HOST
                          : k == "device"
                              ? v1::DEVICE
                              : throw UsageError{"--kind must be host, pinned or device"};
    v1::AllocateRequest request;
    request.set_size(SizeArg(args[1]));
    request.set_kind(kind);
    request.set_device(absl::GetFlag(FLAGS_gpu));
    SetLease(request.mutable_lease_ttl());
    request.set_label(absl::GetFlag(FLAGS_label));
    request.set_node(absl::GetFlag(FLAGS_node));
    request.set_exportable(absl::GetFlag(FLAGS_exportable));
    auto b = c.Allocate(request);
    if (!b.ok()) return Fail(b.status());
    if (json)
      std::cout << Json(*b);
    else
      std::cout << b->id() << "\n";
    return 0;
  }
  if (cmd == "ls") {
    Need(args, 0, "ls");
    auto list = c.ListBuffers(absl::GetFlag(FLAGS_node));
    if (!list.ok()) return Fail(list.status());
    if (json) {
      v1::ListBuffersResponse r;
      for (auto& b : *list) *r.add_buffers() = b;
      return std::cout << Json(r), 0;
    }
    std::cout << absl::StrFormat("%-20s %-7s %-12s %-5s %-10s %s\n", "ID", "KIND", "SIZE", "USES",
                                 "LEASE", "LABEL");
    for (const auto& b : *list) {
      std::string lease = "-";
      if (b.has_lease_expire_time()) {
        const absl::Duration left =
            absl::FromUnixSeconds(b.lease_expire_time().seconds()) - absl::Now();
        lease = absl::StrCat(std::max<int64_t>(0, absl::ToInt64Seconds(left)), "s");
      }
      std::cout << absl::StrFormat("%-20s %-7s %-12s %-5d %-10s %s\n", b.id(),
                                   Kind(b.kind(), b.device()), FormatBytes(b.size()),
                                   b.active_uses(), lease, b.label());
    }
    return 0;
  }
  if (cmd == "get") {
    Need(args, 1, "get BUF");
    const v1::BufferRef ref = RefArg(args[1]);
    auto b = c.GetBuffer(ref.buffer_id(), ref.node());
    if (!b.ok()) return Fail(b.status());
    std::cout << Json(*b);
    return 0;
  }
  if (cmd == "export") {
    Need(args, 1, "export BUF");
    const v1::BufferRef ref = RefArg(args[1]);
    auto e = c.Export(ref.buffer_id(), ref.node());
    if (!e.ok()) return Fail(e.status());
    if (json) return std::cout << Json(*e), 0;
    std::cout << absl::StrFormat("handle %s\noffset %d\nsize   %d\ngpu    %d %s\n",
                                 absl::BytesToHexString(e->cuda_ipc_handle()), e->offset(),
                                 e->size(), e->device(), e->device_uuid());
    return 0;
  }
  if (cmd == "import") {
    Need(args, 2, "import HANDLE_HEX SIZE --gpu_uuid GPU-... [--offset N] [--pid P]");
    v1::ImportRequest r;
    if (args[1].size() != 128 ||
        args[1].find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
      throw UsageError{"HANDLE_HEX must be the 64-byte CUDA IPC handle as 128 hex digits"};
    }
    r.set_cuda_ipc_handle(absl::HexStringToBytes(args[1]));
    r.set_size(SizeArg(args[2]));
    r.set_offset(SizeArg(absl::GetFlag(FLAGS_offset)));
    r.set_device_uuid(absl::GetFlag(FLAGS_gpu_uuid));
    r.set_owner_pid(absl::GetFlag(FLAGS_pid));
    r.set_label(absl::GetFlag(FLAGS_label));
    r.set_node(absl::GetFlag(FLAGS_node));
    SetLease(r.mutable_lease_ttl());
    auto b = c.Import(r);
    if (!b.ok()) return Fail(b.status());
    if (json)
      std::cout << Json(*b);
    else
      std::cout << b->id() << "\n";
    return 0;
  }
  if (cmd == "release") {
    Need(args, 1, "release BUF");
    const v1::BufferRef ref = RefArg(args[1]);
    if (auto st = c.Release(ref.buffer_id(), ref.node()); !st.ok()) return Fail(st);
    return 0;
  }
  if (cmd == "renew") {
    Need(args, 1, "renew BUF [--lease TTL]");
    const v1::BufferRef ref = RefArg(args[1]);
    auto b = c.RenewLease(ref.buffer_id(), absl::GetFlag(FLAGS_lease), ref.node());
    if (!b.ok()) return Fail(b.status());
    if (json) std::cout << Json(*b);
    return 0;
  }
  if (cmd == "write") {
    Need(args, 2, "write BUF FILE [--offset N]");
    v1::BufferRef target = RefArg(args[1]);
    if (target.offset() == 0) target.set_offset(SizeArg(absl::GetFlag(FLAGS_offset)));
    absl::StatusOr<v1::WriteResponse> r;
    if (args[2] == "-") {
      std::string data((std::istreambuf_iterator<char>(std::cin)),
                       std::istreambuf_iterator<char>());
      r = c.Write(target, data);
    } else {
      FILE* f = std::fopen(args[2].c_str(), "rb");
      struct stat st;
      if (f == nullptr || fstat(fileno(f), &st) != 0) {
        return Fail(LocalFileError(args[2], errno));
      }
      r = c.WriteFrom(target, st.st_size,
                      [f](char* out, size_t n) { return std::fread(out, 1, n, f); });
      std::fclose(f);
    }
    if (!r.ok()) return Fail(r.status());
    if (json)
      std::cout << Json(*r);
    else
      std::cerr << "wrote " << FormatBytes(r->bytes_written()) << "\n";
    return 0;
  }
  if (cmd == "read") {
    Need(args, 2, "read BUF FILE [--offset N] [--length N]");
    v1::BufferRef source = RefArg(args[1]);
    if (source.offset() == 0) source.set_offset(SizeArg(absl::GetFlag(FLAGS_offset)));
    source.set_length(SizeArg(absl::GetFlag(FLAGS_length)));
    FILE* f = args[2] == "-" ? stdout : std::fopen(args[2].c_str(), "wb");
    if (f == nullptr) {
      return Fail(LocalFileError(args[2], errno));
    }
    auto st = c.ReadTo(source, [f](absl::string_view data) {
      if (std::fwrite(data.data(), 1, data.size(), f) != data.size()) {
        return absl::DataLossError(absl::StrCat("short write: ", std::strerror(errno)));
      }
      return absl::OkStatus();
    });
    if (f != stdout)
      std::fclose(f);
    else
      std::fflush(stdout);
    if (!st.ok()) return Fail(st);
    return 0;
  }
  if (cmd == "move") {
    Need(args, 2, "move SRC DST [--length N] [--checksum] [--no-wait]");
    v1::SubmitRequest request;
    v1::TransferSpec* spec = request.add_transfers();
    *spec->mutable_source() = RefArg(args[1]);
    *spec->mutable_destination() = RefArg(args[2]);
    spec->mutable_source()->set_length(SizeArg(absl::GetFlag(FLAGS_length)));
    spec->set_checksum(absl::GetFlag(FLAGS_checksum));
    spec->set_label(absl::GetFlag(FLAGS_label));
    if (auto notify = absl::GetFlag(FLAGS_notify)) spec->set_notify(*notify);
    if (!absl::GetFlag(FLAGS_prepared).empty()) {
      if (!absl::GetFlag(FLAGS_blocks).empty()) {
        throw UsageError{"--prepared or --blocks, not both"};
      }
      spec->set_prepared_pieces(absl::GetFlag(FLAGS_prepared));
    }
    if (!absl::GetFlag(FLAGS_blocks).empty()) *spec->mutable_blocks() = BlocksArg();
    v1::Path path;
    std::string p = absl::AsciiStrToUpper(absl::GetFlag(FLAGS_path));
    if (p == "AUTO") p = "PATH_AUTO";
    if (!v1::Path_Parse(p, &path))
      throw UsageError{"--path must be auto, local, cuda_ipc, ucx or mpi"};
    spec->set_path(path);
    request.set_idempotency_key(absl::GetFlag(FLAGS_idempotency_key));
    auto submitted = c.Submit(request);
    if (!submitted.ok()) return Fail(submitted.status());
    v1::Transfer t = submitted->transfers(0);
    if (!absl::GetFlag(FLAGS_wait)) {
      if (json)
        std::cout << Json(t);
      else
        std::cout << t.id() << "\n";
      return 0;
    }
    const bool tty = isatty(STDERR_FILENO) && !json;
    ProgressBar bar;
    auto end = c.Watch(t.id(), [&](const v1::Transfer& e) {
      if (tty) bar.Draw(e);
    });
    bar.End();
    if (!end.ok()) return Fail(end.status());
    if (json)
      std::cout << Json(*end);
    else
      PrintTransfer(*end);
    return end->state() == v1::SUCCEEDED ? 0 : 1;
  }
  if (cmd == "prepare") {
    Need(args, 0, "prepare --blocks FILE --block_size N [--node N] [--label L]");
    if (absl::GetFlag(FLAGS_blocks).empty()) throw UsageError{"prepare needs --blocks FILE"};
    auto list =
        c.PreparePieces({}, BlocksArg(), absl::GetFlag(FLAGS_node), absl::GetFlag(FLAGS_label));
    if (!list.ok()) return Fail(list.status());
    if (json) return std::cout << Json(*list), 0;
    std::cout << list->id() << "\n";
    return 0;
  }
  if (cmd == "prepared") {
    Need(args, 0, "prepared [--node N]");
    auto lists = c.ListPreparedPieces(absl::GetFlag(FLAGS_node));
    if (!lists.ok()) return Fail(lists.status());
    if (json) {
      v1::ListPreparedPiecesResponse r;
      for (auto& l : *lists) *r.add_lists() = l;
      return std::cout << Json(r), 0;
    }
    if (lists->empty()) std::cout << "no prepared piece lists\n";
    for (const auto& l : *lists) {
      std::cout << absl::StrFormat("%s  %d pieces  %s  extents %d / %d  %s\n", l.id(), l.pieces(),
                                   FormatBytes(l.bytes()), l.source_extent(),
                                   l.destination_extent(), l.label());
    }
    return 0;
  }
  if (cmd == "release-pieces") {
    Need(args, 1, "release-pieces ID");
    absl::Status st = c.ReleasePieces(args[1]);
    return st.ok() ? 0 : Fail(st);
  }
  if (cmd == "notifications") {
    Need(args, 0, "notifications [--node N] [--buffers B1,B2] [--after SEQ] [--count N]");
    v1::NotificationsRequest request;
    request.set_node(absl::GetFlag(FLAGS_node));
    for (absl::string_view b :
         absl::StrSplit(absl::GetFlag(FLAGS_buffers), ',', absl::SkipEmpty())) {
      request.add_buffers(std::string(b));
    }
    if (auto after = absl::GetFlag(FLAGS_after)) request.set_after_sequence(*after);
    auto stream = c.Subscribe(request);
    if (!stream.ok()) return Fail(stream.status());
    const int count = absl::GetFlag(FLAGS_count);
    v1::Notification n;
    for (int seen = 0; (count == 0 || seen < count) && (*stream)->Next(&n); ++seen) {
      if (json) {
        std::cout << Json(n) << std::flush;
        continue;
      }
      if (n.missed() > 0) std::cout << "(" << n.missed() << " missed)\n";
      if (n.transfer_id().empty()) continue;  // A loss reported on its own.
      std::cout << absl::StrFormat("%d  %s  %s -> %s  %s\n", n.sequence(), n.transfer_id(),
                                   n.source_node(), n.destination_buffer(),
                                   absl::CHexEscape(n.notify()))
                << std::flush;
    }
    if (count > 0) {
      (*stream)->Cancel();
      return 0;
    }
    absl::Status st = (*stream)->Finish();
    return st.ok() ? 0 : Fail(st);
  }
  if (cmd == "transfers") {
    Need(args, 0, "transfers [--state S]");
    std::vector<v1::TransferState> states;
    if (!absl::GetFlag(FLAGS_state).empty()) {
      v1::TransferState s;
      if (!v1::TransferState_Parse(absl::AsciiStrToUpper(absl::GetFlag(FLAGS_state)), &s)) {
        throw UsageError{"--state must be queued, running, succeeded, failed or cancelled"};
      }
      states.push_back(s);
    }
    auto list = c.ListTransfers(states);
    if (!list.ok()) return Fail(list.status());
    if (json) {
      v1::ListTransfersResponse r;
      for (auto& t : *list) *r.add_transfers() = t;
      return std::cout << Json(r), 0;
    }
    if (list->empty()) std::cout << "no transfers\n";
    for (const auto& t : *list) PrintTransfer(t);
    return 0;
  }
  if (cmd == "transfer" || cmd == "wait" || cmd == "cancel") {
    Need(args, 1, (cmd + " ID").c_str());
    auto t = cmd == "transfer" ? c.GetTransfer(args[1])
             : cmd == "wait"   ? c.Wait(args[1])
                               : c.Cancel(args[1], absl::GetFlag(FLAGS_wait));
    if (!t.ok()) return Fail(t.status());
    if (json)
      std::cout << Json(*t);
    else
      PrintTransfer(*t);
    if (cmd == "wait" && t->state() != v1::SUCCEEDED) return 1;
    return 0;
  }
  throw UsageError{absl::StrCat("unknown command \"", cmd, "\"; run gpumovectl --help")};
}

// absl flags use underscores; people type --no-wait and --idempotency-key.
std::vector<char*> NormalizeFlags(int argc, char** argv, std::vector<std::string>& storage) {
  storage.assign(argv, argv + argc);
  for (std::string& a : storage) {
    if (a.rfind("--", 0) != 0) continue;
    const size_t eq = a.find('=');
    for (size_t i = 2; i < std::min(eq, a.size()); ++i) {
      if (a[i] == '-') a[i] = '_';
    }
    if (a.rfind("--no_", 0) == 0) a = "--no" + a.substr(5);
  }
  std::vector<char*> out;
  for (std::string& a : storage) out.push_back(a.data());
  return out;
}

}  // namespace
}  // namespace gpumove

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(gpumove::kUsage);
  std::vector<std::string> storage;
  std::vector<char*> normalized = gpumove::NormalizeFlags(argc, argv, storage);
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(normalized.size()), normalized.data());
  std::vector<std::string> args(positional.begin() + 1, positional.end());
  if (args.empty()) {
    std::cerr << gpumove::kUsage << "\n";
    return 2;
  }
  std::string addr = absl::GetFlag(FLAGS_addr);
  if (addr.empty()) {
    const char* env = std::getenv("GPUMOVE_ADDR");
    addr = env != nullptr && *env != '\0' ? env : "127.0.0.1:7470";
  }
  try {
    gpumove::ConnectOptions connect;
    connect.timeout = absl::GetFlag(FLAGS_timeout);
    connect.tls_ca = absl::GetFlag(FLAGS_tls_ca);
    if (const char* env = std::getenv("GPUMOVE_TLS_CA"); connect.tls_ca.empty() && env != nullptr) {
      connect.tls_ca = env;
    }
    connect.tls_cert = absl::GetFlag(FLAGS_tls_cert);
    connect.tls_key = absl::GetFlag(FLAGS_tls_key);
    connect.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
    if (const std::string file = absl::GetFlag(FLAGS_token_file); !file.empty()) {
      std::ifstream in(file);
      if (!in) {
        std::cerr << "error: cannot read --token_file " << file << "\n";
        return 2;
      }
      std::getline(in, connect.token);
      connect.token = std::string(absl::StripAsciiWhitespace(connect.token));
    } else if (const char* env = std::getenv("GPUMOVE_TOKEN"); env != nullptr) {
      connect.token = env;
    }
    auto client = gpumove::Client::Connect(addr, connect);
    if (!client.ok()) return gpumove::Fail(client.status());
    return gpumove::Run(**client, args);
  } catch (const gpumove::UsageError& e) {
    std::cerr << "error: " << e.message << "\n";
    return 2;
  }
}
