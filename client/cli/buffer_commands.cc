// gpumovectl's buffer commands: alloc, ls, get, release, renew, export, import, write, read.
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/cli.h"
#include "client/cli/flags.h"
#include "client/ref.h"
#include "daemon/common/bytes.h"
#include "google/protobuf/struct.pb.h"

namespace gpumove::cli {
namespace {

// A buffer's id in text, its whole record with --json.
int PrintBuffer(const v1::Buffer& b) {
  if (JsonOutput()) return PrintJson(b), 0;
  std::cout << b.id() << "\n";
  return 0;
}

std::string LeaseLeft(const v1::Buffer& b) {
  if (!b.has_lease_expire_time()) return "-";
  const absl::Duration left = absl::FromUnixSeconds(b.lease_expire_time().seconds()) - absl::Now();
  return HumanDuration(std::max(absl::ZeroDuration(), left));
}

std::vector<std::string> BufferRow(const v1::Buffer& b) {
  std::string note = b.imported() ? "imported" : b.exportable() ? "exportable" : "";
  return {b.id(), b.node(), Kind(b.kind(), b.device()), FormatBytes(b.size()),
          absl::StrCat(b.active_uses()), LeaseLeft(b), b.label().empty() ? "-" : b.label(),
          note.empty() ? "-" : note};
}

const std::vector<std::string> kBufferHeader = {"ID",    "NODE",  "KIND", "SIZE",
                                                "USES",  "LEASE", "LABEL", "NOTE"};

int Alloc(Client& c, const Args& args) {
  Need(args, 1);
  const std::string k = absl::GetFlag(FLAGS_kind);
  v1::MemoryKind kind = k == "host"     ? v1::HOST
                        : k == "pinned" ? v1::PINNED_HOST
                        : k == "device" ? v1::DEVICE
                                        : throw UsageError{absl::StrCat(
                                              "--kind must be host, pinned or device, not ", k)};
  v1::AllocateRequest request;
  request.set_size(SizeArg(args[1], "SIZE"));
  if (request.size() == 0) throw UsageError{"SIZE must be at least 1 byte"};
  request.set_kind(kind);
  request.set_device(absl::GetFlag(FLAGS_gpu));
  SetLease(request.mutable_lease_ttl());
  request.set_label(absl::GetFlag(FLAGS_label));
  request.set_node(absl::GetFlag(FLAGS_node));
  request.set_exportable(absl::GetFlag(FLAGS_exportable));
  auto b = c.Allocate(request);
  if (!b.ok()) return Fail(b.status());
  return PrintBuffer(*b);
}

int RegisterFile(Client& c, const Args& args) {
  Need(args, 2);
  v1::RegisterFileRequest request;
  request.set_path(args[1]);
  request.set_length(SizeArg(args[2], "LENGTH"));
  request.set_offset(SizeArg(absl::GetFlag(FLAGS_offset), "--offset"));
  request.set_root(absl::GetFlag(FLAGS_root));
  request.set_writable(absl::GetFlag(FLAGS_writable));
  request.set_create(absl::GetFlag(FLAGS_create));
  if (request.create() && !request.writable()) throw UsageError{"--create needs --writable"};
  SetLease(request.mutable_lease_ttl());
  request.set_label(absl::GetFlag(FLAGS_label));
  request.set_node(absl::GetFlag(FLAGS_node));
  auto b = c.RegisterFile(request);
  if (!b.ok()) return Fail(b.status());
  return PrintBuffer(*b);
}

int List(Client& c, const Args& args) {
  Need(args, 0);
  auto list = c.ListBuffers(absl::GetFlag(FLAGS_node));
  if (!list.ok()) return Fail(list.status());
  if (JsonOutput()) {
    v1::ListBuffersResponse r;
    for (auto& b : *list) *r.add_buffers() = b;
    return PrintJson(r), 0;
  }
  if (list->empty()) {
    std::cout << "no buffers\n";
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {kBufferHeader};
  for (const auto& b : *list) rows.push_back(BufferRow(b));
  PrintTable(rows);
  return 0;
}

int Get(Client& c, const Args& args) {
  Need(args, 1);
  const v1::BufferRef ref = RefArg(args[1]);
  auto b = c.GetBuffer(ref.buffer_id(), ref.node());
  if (!b.ok()) return Fail(b.status());
  if (JsonOutput()) return PrintJson(*b), 0;
  PrintTable({kBufferHeader, BufferRow(*b)});
  return 0;
}

int Export(Client& c, const Args& args) {
  Need(args, 1);
  const v1::BufferRef ref = RefArg(args[1]);
  auto e = c.Export(ref.buffer_id(), ref.node());
  if (!e.ok()) return Fail(e.status());
  if (JsonOutput()) return PrintJson(*e), 0;
  std::cout << absl::StrFormat("handle %s\noffset %d\nsize   %d\ngpu    %d %s\n",
                               absl::BytesToHexString(e->cuda_ipc_handle()), e->offset(),
                               e->size(), e->device(), e->device_uuid());
  return 0;
}

int Import(Client& c, const Args& args) {
  Need(args, 2);
  v1::ImportRequest r;
  if (args[1].size() != 128 ||
      args[1].find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
    throw UsageError{"HANDLE_HEX must be the 64-byte CUDA IPC handle as 128 hex digits"};
  }
  r.set_cuda_ipc_handle(absl::HexStringToBytes(args[1]));
  r.set_size(SizeArg(args[2], "SIZE"));
  r.set_offset(SizeArg(absl::GetFlag(FLAGS_offset), "--offset"));
  r.set_device_uuid(absl::GetFlag(FLAGS_gpu_uuid));
  r.set_owner_pid(absl::GetFlag(FLAGS_pid));
  r.set_label(absl::GetFlag(FLAGS_label));
  r.set_node(absl::GetFlag(FLAGS_node));
  SetLease(r.mutable_lease_ttl());
  auto b = c.Import(r);
  if (!b.ok()) return Fail(b.status());
  return PrintBuffer(*b);
}

int Release(Client& c, const Args& args) {
  Need(args, 1);
  const v1::BufferRef ref = RefArg(args[1]);
  if (auto st = c.Release(ref.buffer_id(), ref.node()); !st.ok()) return Fail(st);
  if (JsonOutput()) {
    google::protobuf::Struct s;
    (*s.mutable_fields())["released"].set_string_value(ref.buffer_id());
    PrintJson(s);
  }
  return 0;
}

int Renew(Client& c, const Args& args) {
  Need(args, 1);
  const v1::BufferRef ref = RefArg(args[1]);
  auto b = c.RenewLease(ref.buffer_id(), absl::GetFlag(FLAGS_lease), ref.node());
  if (!b.ok()) return Fail(b.status());
  if (JsonOutput()) return PrintJson(*b), 0;
  std::cout << b->id() << " lease " << LeaseLeft(*b) << "\n";
  return 0;
}

int Write(Client& c, const Args& args) {
  Need(args, 2);
  v1::BufferRef target = RefArg(args[1]);
  if (target.offset() == 0) target.set_offset(SizeArg(absl::GetFlag(FLAGS_offset), "--offset"));
  absl::StatusOr<v1::WriteResponse> r;
  if (args[2] == "-") {
    std::string data((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    r = c.Write(target, data);
  } else {
    FILE* f = std::fopen(args[2].c_str(), "rb");
    struct stat st;
    if (f == nullptr || fstat(fileno(f), &st) != 0) {
      const int err = errno;
      if (f != nullptr) std::fclose(f);
      return Fail(LocalFileError(args[2], err));
    }
    r = c.WriteFrom(target, st.st_size,
                    [f](char* out, size_t n) { return std::fread(out, 1, n, f); });
    std::fclose(f);
  }
  if (!r.ok()) return Fail(r.status());
  if (JsonOutput()) return PrintJson(*r), 0;
  std::cerr << "wrote " << FormatBytes(r->bytes_written()) << "\n";
  return 0;
}

int Read(Client& c, const Args& args) {
  Need(args, 2);
  v1::BufferRef source = RefArg(args[1]);
  if (source.offset() == 0) source.set_offset(SizeArg(absl::GetFlag(FLAGS_offset), "--offset"));
  source.set_length(SizeArg(absl::GetFlag(FLAGS_length), "--length"));
  const bool to_stdout = args[2] == "-";
  if (to_stdout && JsonOutput()) {
    throw UsageError{"read to - writes the bytes to stdout; --json needs a FILE"};
  }
  FILE* f = to_stdout ? stdout : std::fopen(args[2].c_str(), "wb");
  if (f == nullptr) return Fail(LocalFileError(args[2], errno));
  uint64_t bytes = 0;
  auto st = c.ReadTo(source, [f, &bytes](absl::string_view data) {
    if (std::fwrite(data.data(), 1, data.size(), f) != data.size()) {
      return absl::DataLossError(absl::StrCat("short write: ", std::strerror(errno)));
    }
    bytes += data.size();
    return absl::OkStatus();
  });
  if (f != stdout)
    std::fclose(f);
  else
    std::fflush(stdout);
  if (!st.ok()) return Fail(st);
  if (JsonOutput()) {
    google::protobuf::Struct s;
    (*s.mutable_fields())["bytes_read"].set_number_value(static_cast<double>(bytes));
    (*s.mutable_fields())["file"].set_string_value(args[2]);
    PrintJson(s);
  }
  return 0;
}

}  // namespace

std::vector<Command> BufferCommands() {
  return {
      {"alloc", "SIZE", "allocate a buffer (on --node); prints its id",
       {"kind", "gpu", "lease", "label", "node", "exportable"},
       "gpumovectl alloc 64MiB --kind device --gpu 0 --lease 10m --label kv-cache", Alloc},
      {"file", "PATH LENGTH",
       "a region of a file under one of the node's --file_roots as a buffer; prints its id",
       {"root", "offset", "writable", "create", "lease", "label", "node"},
       "gpumovectl file ckpt/model-00001.safetensors 4GiB --writable --create", RegisterFile},
      {"ls", "", "list buffers (of --node)", {"node"}, "gpumovectl ls --node node-b", List},
      {"get", "BUF", "show one buffer", {}, "gpumovectl get node-b/b-1f3a9c0d2e4b5a67", Get},
      {"release", "BUF", "free a buffer", {}, "gpumovectl release b-1f3a9c0d2e4b5a67", Release},
      {"renew", "BUF", "restart a buffer's lease (--lease: a new length)", {"lease"},
       "gpumovectl renew b-1f3a9c0d2e4b5a67 --lease 30m", Renew},
      {"export", "BUF", "CUDA IPC handle and offset of an exportable device buffer", {},
       "gpumovectl export b-1f3a9c0d2e4b5a67", Export},
      {"import", "HANDLE_HEX SIZE", "lend part of a process's GPU allocation to the daemon",
       {"gpu_uuid", "offset", "pid", "label", "node", "lease"},
       "gpumovectl import 0a1b...(128 hex digits) 64MiB --gpu_uuid GPU-259bb68d-... --pid 4242",
       Import},
      {"write", "BUF FILE", "copy FILE (- for stdin) into BUF", {"offset"},
       "gpumovectl write b-1f3a9c0d2e4b5a67 weights.bin", Write},
      {"read", "BUF FILE", "copy bytes of BUF into FILE (- for stdout)", {"offset", "length"},
       "gpumovectl read b-1f3a9c0d2e4b5a67@4KiB - --length 16 | xxd", Read},
  };
}

}  // namespace gpumove::cli
