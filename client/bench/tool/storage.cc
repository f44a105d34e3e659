// `gpumove-bench storage` (issue 53's path FILE_IO): host memory -> a FILE buffer and
// back through the daemon (one Submit with wait a move; --storage_durable adds fdatasync),
// against pwrite and pread of the same bytes from this process on a file in the same
// directory opened O_DIRECT as the daemon does for aligned bytes (and, beside, buffered
// through the page cache), fdatasync likewise; sizes --storage_min_size ...
// --storage_max_size by 4.
// The files live in a directory of their own under --storage_dir (the daemon's
// --file_roots) and are removed at the end.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/bench/tool/bench.h"
#include "daemon/common/bytes.h"

ABSL_FLAG(gpumove::ByteSize, storage_min_size, gpumove::ByteSize{64 << 10},
          "storage: smallest move.");
ABSL_FLAG(gpumove::ByteSize, storage_max_size, gpumove::ByteSize{256ull << 20},
          "storage: largest move.");
ABSL_FLAG(std::string, storage_dir, "/tmp", "storage: where the files go (a directory of its own "
          "is made in it and removed).");
ABSL_FLAG(bool, storage_durable, false, "storage: writes on stable storage before they end "
          "(fdatasync on both sides).");

namespace gpumove::bench {
namespace {

// pwrite or pread of `n` bytes at 0, whole (short transfers continued); fdatasync after a
// write when `durable`.
bool Io(int fd, char* buf, uint64_t n, bool write, bool durable) {
  uint64_t done = 0;
  while (done < n) {
    const ssize_t r =
        write ? pwrite(fd, buf + done, n - done, done) : pread(fd, buf + done, n - done, done);
    if (r <= 0) return false;
    done += r;
  }
  return !(write && durable) || fdatasync(fd) == 0;
}

absl::Status RunStorage(const Context& ctx, Run& run) {
  const uint64_t min_size = absl::GetFlag(FLAGS_storage_min_size).bytes;
  const uint64_t max_size = absl::GetFlag(FLAGS_storage_max_size).bytes;
  const bool durable = absl::GetFlag(FLAGS_storage_durable);
  if (min_size == 0 || min_size > max_size || max_size > (8ull << 30)) {
    return absl::InvalidArgumentError(
        "--storage_min_size must be > 0 and at most --storage_max_size (at most 8 GiB)");
  }
  if (!ctx.addr.empty()) {
    return absl::InvalidArgumentError("storage starts its own daemon (its --file_roots)");
  }
  std::string tmpl = absl::GetFlag(FLAGS_storage_dir) + "/gpumove-bench-storage.XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cannot make a directory in ",
                                                      absl::GetFlag(FLAGS_storage_dir)));
  }
  const std::string dir = tmpl;
  run.SetFlag("storage_min_size", FormatBytes(min_size));
  run.SetFlag("storage_max_size", FormatBytes(max_size));
  run.SetFlag("storage_durable", durable ? "true" : "false");
  run.SetFlag("storage_dir", absl::GetFlag(FLAGS_storage_dir));
  // The measurement, in a function of its own so that the directory goes whatever it says.
  absl::Status st = [&]() -> absl::Status {
    std::vector<std::unique_ptr<DaemonProcess>> own;
    auto d = ctx.Connect({absl::StrCat("--host_pool_size=", 2 * max_size + (64 << 20)),
                          "--pinned_pool_size=0", "--device_pool_size=0", "--node=bench",
                          "--file_roots=" + dir},
                         own, run);
    if (!d.ok()) return d.status();
    Client& c = *d->client;
    auto host = c.Allocate(max_size, v1::HOST);
    if (!host.ok()) return host.status();
    auto back = c.Allocate(max_size, v1::HOST);
    if (!back.ok()) return back.status();
    if (auto w = c.Write(Ref(host->id()), std::string(max_size, 'g')); !w.ok()) return w.status();
    v1::RegisterFileRequest r;
    r.set_path("gpumove.bin");
    r.set_length(max_size);
    r.set_writable(true);
    r.set_create(true);
    auto file = c.RegisterFile(r);
    if (!file.ok()) return file.status();
    const std::string raw_path = dir + "/raw.bin", direct_path = dir + "/raw_direct.bin";
    const int fd = open(raw_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return absl::InternalError("cannot open " + raw_path);
    // The daemon writes and reads a move's 4 KiB-aligned part O_DIRECT where the file
    // system allows it: the like-for-like baseline does too (none on tmpfs).
    const int direct_fd =
        open(direct_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0600);
    void* p = mmap(nullptr, max_size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
      close(fd);
      return absl::ResourceExhaustedError("mmap");
    }
    char* raw = static_cast<char*>(p);
    std::memset(raw, 'r', max_size);
    const bool direct = direct_fd >= 0;
    run.SetFlag("baseline_o_direct", direct ? "true" : "false");
    run.AddSeries("gpumove write", false, "GB/s", true, direct ? "pwrite O_DIRECT" : "pwrite");
    run.AddSeries("gpumove read", false, "GB/s", true, direct ? "pread O_DIRECT" : "pread");
    if (direct) {
      run.AddSeries("pwrite O_DIRECT", true, "GB/s", true);
      run.AddSeries("pread O_DIRECT", true, "GB/s", true);
    }
    if (direct) {
      run.AddContext("pwrite", "GB/s", true);
      run.AddContext("pread", "GB/s", true);
    } else {
      run.AddSeries("pwrite", true, "GB/s", true);
      run.AddSeries("pread", true, "GB/s", true);
    }
    absl::Status failed;
    MoveOptions o;
    o.durable = durable;
    for (int round = 0; round < ctx.rounds && failed.ok(); ++round) {
      for (uint64_t size = min_size; size <= max_size && failed.ok(); size *= 4) {
        auto move = [&](bool write) {
          auto t = write ? c.Move(Ref(host->id(), 0, size), Ref(file->id()), o)
                         : c.Move(Ref(file->id(), 0, size), Ref(back->id()), o);
          if (!t.ok()) {
            failed = t.status();
          } else if (t->state() != v1::SUCCEEDED) {
            failed = absl::InternalError(t->error_message());
          }
        };
        for (bool write : {true, false}) {
          // In turns: the order of the sides rotates by round.
          const int sides = direct ? 3 : 2;
          for (int k = 0; k < sides && failed.ok(); ++k) {
            const int side = (k + round) % sides;  // 0: gpumove, 1: buffered, 2: O_DIRECT.
            std::function<void()> op = [&] { move(write); };
            std::string name = write ? "gpumove write" : "gpumove read";
            if (side > 0) {
              const int f = side == 1 ? fd : direct_fd;
              op = [&, f] {
                if (!Io(f, raw, size, write, durable)) failed = absl::InternalError("pwrite/pread");
              };
              name = absl::StrCat(write ? "pwrite" : "pread", side == 2 ? " O_DIRECT" : "");
            }
            const double s = MedianSeconds(op, ctx.seconds);
            if (failed.ok()) run.Add(name, size, 1, size / s / 1e9);
          }
        }
        if (size > max_size / 4) break;  // No overflow past the largest.
      }
    }
    munmap(raw, max_size);
    close(fd);
    unlink(raw_path.c_str());
    if (direct) close(direct_fd);
    unlink(direct_path.c_str());
    return failed;
  }();
  unlink((dir + "/gpumove.bin").c_str());
  rmdir(dir.c_str());
  return st;
}

}  // namespace

Subcommand StorageSubcommand() {
  return {"storage",
          "host memory -> FILE buffer and back (path FILE_IO) against pwrite and pread",
          RunStorage};
}

}  // namespace gpumove::bench
