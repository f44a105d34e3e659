#include "daemon/path/file/file_engine.h"

#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "daemon/common/bytes.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"
#include "daemon/common/status_macros.h"

namespace gpumove {
namespace {

bool HostMemory(const Endpoint& e) {
  return e.kind == MemoryKind::kHost || e.kind == MemoryKind::kPinnedHost;
}

absl::Status IoError(int err, bool write, const FileRegion& f, uint64_t at) {
  const std::string what = absl::StrCat(write ? "writing " : "reading ", Quoted(f.path()),
                                        " at byte ", at, ": ", strerror(err));
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) return absl::ResourceExhaustedError(what);
  return absl::InternalError(what);
}

// A read or write that moved nothing: the file ended (truncated under the move).
absl::Status Ended(const FileRegion& f, bool write, uint64_t at) {
  return absl::FailedPreconditionError(
      absl::StrCat("file ", Quoted(f.path()), " ended at byte ", at,
                   write ? " (a write of 0 bytes)" : ", before the region's end (truncated?)"));
}

// Tries io_uring once: some sandboxes and seccomp profiles refuse io_uring_setup.
std::string ProbeUring() {
  struct io_uring ring;
  const int rc = io_uring_queue_init(2, &ring, 0);
  if (rc < 0) return absl::StrCat("io_uring_queue_init: ", strerror(-rc));
  io_uring_queue_exit(&ring);
  return "";
}

// EINTR and EAGAIN retries over a whole move.
constexpr int kMaxRetries = 1000;

}  // namespace

// One read or write: `length` bytes at `pos` from the start of the move.
struct FileEngine::Piece {
  uint64_t pos = 0;
  uint64_t length = 0;
  bool direct = false;
};

struct FileEngine::Plan {
  const FileRegion* file = nullptr;
  uint64_t file_offset = 0;  // Of the move's first byte.
  char* memory = nullptr;
  bool write = false;  // Memory into the file.
  uint64_t length = 0;
  std::vector<Piece> pieces;
  int fd(const Piece& p) const { return p.direct ? file->direct_fd() : file->fd(); }
};

FileEngine::FileEngine(FileEngineOptions options)
    : options_([&] {
        options.chunk =
            std::max(kDirectAlignment, options.chunk / kDirectAlignment * kDirectAlignment);
        options.queue_depth = std::clamp(options.queue_depth, 1u, 256u);
        return options;
      }()) {
  why_not_ = options_.force_fallback ? "forced (--file_io_fallback)" : ProbeUring();
  uring_ = why_not_.empty();
  if (!options_.force_fallback && !uring_) {
    LOG(WARNING) << "io_uring is refused here (" << why_not_
                 << "): path FILE_IO moves with pread/pwrite";
  }
}

std::string FileEngine::Describe() const {
  const std::string chunks = absl::StrCat(FormatBytes(options_.chunk), " chunks");
  if (uring_) return absl::StrCat("io_uring, queue depth ", options_.queue_depth, ", ", chunks);
  return absl::StrCat("pread/pwrite, ", chunks, " (io_uring not used: ", why_not_, ")");
}

absl::Status FileEngine::CanServe(const Endpoint& src, const Endpoint& dst) const {
  if (src.remote != nullptr || dst.remote != nullptr) {
    return absl::FailedPreconditionError(
        "FILE_IO moves between a file and memory of the file's own node (a file to or from "
        "another node is not served yet)");
  }
  const bool src_file = src.kind == MemoryKind::kFile, dst_file = dst.kind == MemoryKind::kFile;
  if (!src_file && !dst_file) {
    return absl::FailedPreconditionError("FILE_IO moves to or from a file buffer");
  }
  if (src_file && dst_file) {
    return absl::FailedPreconditionError("file to file is not served yet");
  }
  const Endpoint& file = src_file ? src : dst;
  const Endpoint& memory = src_file ? dst : src;
  if (file.file == nullptr) return absl::InternalError("a file endpoint without its file");
  if (!HostMemory(memory)) {
    return absl::FailedPreconditionError(
        "between a file and device memory is not served yet (only host memory)");
  }
  if (dst_file && !file.file->writable()) {
    return absl::FailedPreconditionError(
        absl::StrCat("file buffer over ", Quoted(file.file->path()), " is read-only"));
  }
  return absl::OkStatus();
}

absl::Status FileEngine::Move(const Endpoint& src, const Endpoint& dst, uint64_t length,
                              MoveControl& control) {
  GPUMOVE_RETURN_IF_ERROR(CanServe(src, dst));
  Plan plan;
  plan.write = dst.kind == MemoryKind::kFile;
  const Endpoint& f = plan.write ? dst : src;
  plan.file = f.file;
  plan.file_offset = f.file_offset;
  plan.memory = plan.write ? src.data : dst.data;
  plan.length = length;
  // O_DIRECT for the aligned whole pages, the page cache for an unaligned start or tail.
  const bool aligned = plan.file->direct_fd() >= 0 && plan.file_offset % kDirectAlignment == 0 &&
                       reinterpret_cast<uintptr_t>(plan.memory) % kDirectAlignment == 0;
  const uint64_t direct = aligned ? length / kDirectAlignment * kDirectAlignment : 0;
  for (uint64_t pos = 0; pos < length;) {
    const uint64_t end = pos < direct ? direct : length;
    const uint64_t n = std::min(options_.chunk, end - pos);
    plan.pieces.push_back(Piece{pos, n, pos < direct});
    pos += n;
  }
  const bool uring = uring_.load();
  // A few fixed names: the transport is a metrics label (the tail's size goes to the log).
  const char* how = direct == length ? "O_DIRECT"
                    : direct == 0    ? "buffered"
                                     : "O_DIRECT, buffered tail";
  control.Carried(absl::StrCat(uring ? "io_uring " : "pread/pwrite ", how));
  if (control.cancelled()) return absl::CancelledError("cancelled");
  absl::Status st = uring ? RunUring(plan, control) : RunPlain(plan, control);
  if (st.ok() && plan.write && control.durable() && fdatasync(plan.file->fd()) != 0) {
    st = IoError(errno, true, *plan.file, plan.file_offset);
  }
  VLOG(1) << "FILE_IO " << (plan.write ? "write" : "read") << " of " << length << " bytes (" << how
          << ", " << length - direct << " buffered): " << st;
  return st;
}

absl::Status FileEngine::RunPlain(const Plan& plan, MoveControl& control) {
  uint64_t done = 0;
  int retries = 0;
  for (Piece p : plan.pieces) {
    while (p.length > 0) {
      char* mem = plan.memory + p.pos;
      const off_t at = static_cast<off_t>(plan.file_offset + p.pos);
      const ssize_t n =
          plan.write ? pwrite(plan.fd(p), mem, p.length, at) : pread(plan.fd(p), mem, p.length, at);
      if (n < 0 && (errno == EINTR || errno == EAGAIN) && ++retries < kMaxRetries) continue;
      if (n < 0 && errno == EINVAL && p.direct) {  // Stricter O_DIRECT rules: the page cache.
        p.direct = false;
        continue;
      }
      if (n < 0) return IoError(errno, plan.write, *plan.file, at);
      if (n == 0) return Ended(*plan.file, plan.write, at);
      p.pos += n;
      p.length -= n;
      done += n;
    }
    if (!control.Reporter()(done) && done < plan.length) return absl::CancelledError("cancelled");
  }
  return absl::OkStatus();
}

absl::Status FileEngine::RunUring(const Plan& plan, MoveControl& control) {
  struct io_uring ring;
  if (const int rc = io_uring_queue_init(options_.queue_depth, &ring, 0); rc < 0) {
    // Refused after the probe passed (a limit on locked memory, say): this move and the
    // ones after it go by pread/pwrite.
    if (uring_.exchange(false)) {
      LOG(WARNING) << "io_uring_queue_init: " << strerror(-rc)
                   << "; path FILE_IO moves with pread/pwrite from now on";
    }
    return RunPlain(plan, control);
  }
  std::vector<Piece> pieces = plan.pieces;  // Advanced in place by short reads and writes.
  std::deque<size_t> again;                 // Pieces to submit before new ones.
  size_t next = 0;
  unsigned inflight = 0;
  uint64_t done = 0;
  int retries = 0;
  absl::Status st;
  while (true) {
    // Stop submitting once anything failed or a cancel came; always reap what is in flight
    // (the kernel still writes into our memory until it completes).
    while (st.ok() && inflight < options_.queue_depth && (!again.empty() || next < pieces.size())) {
      size_t i;
      if (!again.empty()) {
        i = again.front();
        again.pop_front();
      } else {
        i = next++;
      }
      const Piece& p = pieces[i];
      struct io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (sqe == nullptr) {  // Cannot happen with inflight < entries; submit what we have.
        again.push_front(i);
        break;
      }
      const uint64_t at = plan.file_offset + p.pos;
      if (plan.write) {
        io_uring_prep_write(sqe, plan.fd(p), plan.memory + p.pos, p.length, at);
      } else {
        io_uring_prep_read(sqe, plan.fd(p), plan.memory + p.pos, p.length, at);
      }
      io_uring_sqe_set_data64(sqe, i);
      ++inflight;
    }
    if (st.ok() && io_uring_sq_ready(&ring) > 0) {
      int rc = io_uring_submit(&ring);
      while ((rc == -EINTR || rc == -EAGAIN) && ++retries < kMaxRetries) {
        rc = io_uring_submit(&ring);
      }
      if (rc < 0) {  // What the kernel did not take will never complete: not waited for.
        st = absl::InternalError(absl::StrCat("io_uring_submit: ", strerror(-rc)));
        inflight -= std::min(inflight, io_uring_sq_ready(&ring));
      }
    }
    if (inflight == 0) break;
    struct io_uring_cqe* cqe = nullptr;
    const int rc = io_uring_wait_cqe(&ring, &cqe);
    if (rc == -EINTR && ++retries < kMaxRetries) continue;
    if (rc < 0) {  // Only a broken ring: nothing more can be reaped from it.
      st = absl::InternalError(absl::StrCat("io_uring_wait_cqe: ", strerror(-rc)));
      break;
    }
    const size_t i = io_uring_cqe_get_data64(cqe);
    const int res = cqe->res;
    io_uring_cqe_seen(&ring, cqe);
    --inflight;
    Piece& p = pieces[i];
    const uint64_t at = plan.file_offset + p.pos;
    if (res == -EINTR || res == -EAGAIN) {
      if (++retries < kMaxRetries) {
        again.push_back(i);
        continue;
      }
    } else if (res == -EINVAL && p.direct) {  // Stricter O_DIRECT rules: the page cache.
      p.direct = false;
      again.push_back(i);
      continue;
    }
    if (res < 0) {
      if (st.ok()) st = IoError(-res, plan.write, *plan.file, at);
      continue;
    }
    if (res == 0) {
      if (st.ok()) st = Ended(*plan.file, plan.write, at);
      continue;
    }
    p.pos += res;
    p.length -= res;
    done += res;
    if (p.length > 0) again.push_back(i);  // Short: the rest, next.
    if (st.ok() && !control.Reporter()(done) && done < plan.length) {
      st = absl::CancelledError("cancelled");
    }
  }
  io_uring_queue_exit(&ring);
  return st;
}

absl::StatusOr<uint64_t> HashFileRange(const Endpoint& e, uint64_t length) {
  if (e.file == nullptr) return absl::InternalError("not a file endpoint");
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                 &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  constexpr uint64_t kStep = 1ull << 20;
  std::vector<char> buf(std::min(kStep, std::max<uint64_t>(length, 1)));
  int retries = 0;
  for (uint64_t done = 0; done < length;) {
    const uint64_t at = e.file_offset + done;
    const ssize_t n =
        pread(e.file->fd(), buf.data(), std::min<uint64_t>(buf.size(), length - done), at);
    if (n < 0 && errno == EINTR && ++retries < kMaxRetries) continue;
    if (n < 0) return IoError(errno, false, *e.file, at);
    if (n == 0) return Ended(*e.file, false, at);
    XXH3_64bits_update(state.get(), buf.data(), n);
    done += n;
  }
  return XXH3_64bits_digest(state.get());
}

}  // namespace gpumove
