// MpiTransport's start and finalisation and the calls other threads make (post, wait,
// cancel, fail a peer); the MPI thread's loop that serves them is in mpi_transport_loop.cc.
#include "daemon/path/mpi/mpi_transport.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "daemon/common/log.h"
#include "daemon/path/mpi/mpi_transport_impl.h"

#ifdef GPUMOVE_HAVE_MPI
#include <dlfcn.h>
#endif

namespace gpumove {

bool MpiTransport::LaunchedByMpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                          "MPI_LOCALNRANKS", "MV2_COMM_WORLD_SIZE"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

uint64_t MpiParts::bytes() const {
  if (lengths.empty()) return block * at.size();
  uint64_t sum = 0;
  for (int l : lengths) sum += static_cast<uint64_t>(std::max(l, 0));
  return sum;
}

#ifndef GPUMOVE_HAVE_MPI

absl::StatusOr<std::unique_ptr<MpiTransport>> MpiTransport::Start(MpiOptions) {
  return absl::UnimplementedError("this gpumoved was built without MPI (--config=nompi)");
}
MpiTransport::~MpiTransport() = default;
absl::StatusOr<std::vector<std::string>> MpiTransport::Allgather(const std::string&) {
  return absl::UnimplementedError("no MPI");
}
std::shared_ptr<MpiTransport::Op> MpiTransport::Isend(const void*, uint64_t, int, int) {
  return nullptr;
}
std::shared_ptr<MpiTransport::Op> MpiTransport::Irecv(void*, uint64_t, int, int, bool) {
  return nullptr;
}
std::shared_ptr<MpiTransport::Op> MpiTransport::IsendParts(const void*, Parts, int, int) {
  return nullptr;
}
std::shared_ptr<MpiTransport::Op> MpiTransport::IrecvParts(void*, Parts, int, int, bool) {
  return nullptr;
}
void MpiTransport::Wake(int, int) {}
absl::StatusOr<uint64_t> MpiTransport::Wait(const std::shared_ptr<Op>&) {
  return absl::UnimplementedError("no MPI");
}
absl::StatusOr<uint64_t> MpiTransport::Wait(const std::shared_ptr<Op>&, absl::Time) {
  return absl::UnimplementedError("no MPI");
}
void MpiTransport::CancelReceives(const std::vector<std::shared_ptr<Op>>&, absl::Duration) {}
void MpiTransport::FailPeer(int, const std::string&) {}
size_t MpiTransport::pending() const { return 0; }

#else  // GPUMOVE_HAVE_MPI

using mpi_internal::MpiError;
using mpi_internal::MpiStatus;

namespace {

// Whether the library the daemon runs with (not the headers it was built with) takes
// device pointers, asked the way each family answers: the symbols are looked up at run
// time, so one binary built against a host-only MPI finds the CUDA-aware one it is run
// with (same soname), and the reverse.
bool ProbeCudaAwareness(std::string* how) {
  // Open MPI's cuda extension (4.x, 5.x).
  using OmpiQuery = int (*)();
  if (auto query = reinterpret_cast<OmpiQuery>(dlsym(RTLD_DEFAULT, "MPIX_Query_cuda_support"))) {
    const bool aware = query() == 1;
    *how = absl::StrCat("MPIX_Query_cuda_support() = ", aware ? 1 : 0);
    return aware;
  }
  // MPICH 4 and its derivatives: MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &is).
  using MpichQuery = int (*)(int, int*);
  if (auto query = reinterpret_cast<MpichQuery>(dlsym(RTLD_DEFAULT, "MPIX_GPU_query_support"))) {
    constexpr int kCuda = 0;  // MPIX_GPU_SUPPORT_CUDA, the first of MPICH's enum.
    int aware = 0;
    if (query(kCuda, &aware) != MPI_SUCCESS) aware = 0;
    *how = absl::StrCat("MPIX_GPU_query_support(CUDA) = ", aware);
    return aware == 1;
  }
  *how =
      "the library has no CUDA query (MPIX_Query_cuda_support, MPIX_GPU_query_support); "
      "taken as host-only";
  return false;
}

// The library's first version line, blanks collapsed ("MVAPICH2 Version : 2.3.7",
// "Open MPI v4.1.4, ...", "MPICH Version: 4.0.2").
std::string LibraryName() {
  char library[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(library, &len);
  // Some libraries count the terminating NUL in len.
  const absl::string_view text(library, strnlen(library, std::min<int>(len, sizeof(library))));
  const absl::string_view first = *absl::StrSplit(text, absl::MaxSplits('\n', 1)).begin();
  return absl::StrJoin(absl::StrSplit(first, absl::ByAnyChar(" \t"), absl::SkipEmpty()), " ");
}

// Why the MPI path does not run with thread level `provided`, and the knob where one is known.
absl::Status ThreadLevelRefused(int provided, const std::string& library) {
  std::string why = absl::StrCat(
      "MPI_Init_thread gave thread level ", provided == MPI_THREAD_SINGLE ? "SINGLE" : "unknown",
      " (", provided, "); the MPI path needs FUNNELED (one thread of its own makes every MPI "
      "call); ", library);
  if (absl::StartsWith(library, "MVAPICH2")) {
    absl::StrAppend(&why, ": MVAPICH2 lowers the level while its CPU affinity is on; set "
                          "MV2_ENABLE_AFFINITY=0 for the daemon's ranks");
  }
  return absl::FailedPreconditionError(why);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MpiTransport>> MpiTransport::Start(MpiOptions options) {
  std::unique_ptr<MpiTransport> t(new MpiTransport(options));
  absl::Notification ready;
  absl::Status init;
  MpiTransport* self = t.get();
  t->thread_ = std::thread([self, &ready, &init] {
    int provided = 0;
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) {
      init = absl::UnavailableError(absl::StrCat("MPI_Init_thread: ", rc));
      ready.Notify();
      return;
    }
    MpiWorld& w = self->world_;
    w.library = LibraryName();
    if (provided < MPI_THREAD_FUNNELED) {
      // This thread makes every MPI call, but it is not the process's main thread:
      // SINGLE is not enough. No finalize (collective): a rank given more may be waiting.
      init = ThreadLevelRefused(provided, w.library);
      ready.Notify();
      return;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w.size);
    MPI_Comm local;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &local) ==
        MPI_SUCCESS) {
      MPI_Comm_rank(local, &w.local_rank);
      MPI_Comm_size(local, &w.local_size);
      MPI_Comm_free(&local);
    }
    int* ub = nullptr;
    int flag = 0;
    if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag) == MPI_SUCCESS && flag) {
      w.tag_ub = *ub;
    }
    w.cuda_aware = ProbeCudaAwareness(&w.cuda_awareness);
    uint64_t id = 0;
    if (w.rank == 0) id = std::random_device()() * 0x100000000ull + std::random_device()();
    rc = MPI_Bcast(&id, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    w.world_id = id;
    // `init` and `ready` belong to Start, which may return as soon as ready is notified.
    const absl::Status st = MpiStatus(rc, "MPI_Bcast");
    init = st;
    ready.Notify();
    if (st.ok()) self->Loop();
  });
  ready.WaitForNotification();
  if (!init.ok()) {
    t->thread_.join();
    t->thread_ = std::thread();
    return init;
  }
  return t;
}

MpiTransport::~MpiTransport() {
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  // The loop cancels what is left, finalises (collective) and returns; peers that died
  // can make MPI_Finalize wait forever, so give it a bounded time and leave it behind.
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  {
    absl::MutexLock lock(&mu_);
    auto finalized = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return finalized_; };
    mu_.AwaitWithDeadline(absl::Condition(&finalized), deadline);
    if (!finalized_) {
      LOG(WARNING) << "MPI_Finalize did not return in 10 s (a rank is gone); exiting without it";
      thread_.detach();
      return;
    }
  }
  thread_.join();
}
absl::Status MpiTransport::RunOnMpiThread(std::function<absl::Status()> fn) {
  auto done = std::make_shared<absl::Notification>();
  auto status = std::make_shared<absl::Status>();
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return absl::UnavailableError("MPI is stopping");
    tasks_.push_back([fn = std::move(fn), done, status] {
      *status = fn();
      done->Notify();
    });
  }
  done->WaitForNotification();
  return *status;
}

absl::StatusOr<std::vector<std::string>> MpiTransport::Allgather(const std::string& mine) {
  std::vector<std::string> out;
  absl::Status st = RunOnMpiThread([&]() -> absl::Status {
    const int size = world_.size;
    int len = static_cast<int>(mine.size());
    std::vector<int> lens(size), displs(size);
    absl::Status s = MpiStatus(
        MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather");
    if (!s.ok()) return s;
    int total = 0;
    for (int i = 0; i < size; ++i) {
      displs[i] = total;
      total += lens[i];
    }
    std::string all(total, '\0');
    s = MpiStatus(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(),
                                 MPI_CHAR, MPI_COMM_WORLD),
                  "MPI_Allgatherv");
    if (!s.ok()) return s;
    for (int i = 0; i < size; ++i) out.push_back(all.substr(displs[i], lens[i]));
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  return out;
}

std::shared_ptr<MpiTransport::Op> MpiTransport::Post(bool send, void* data, uint64_t n, int peer,
                                                     int tag, absl::Duration timeout, bool patient,
                                                     std::optional<int32_t> wake, Parts parts) {
  auto op = std::make_shared<Op>();
  op->send = send;
  op->patient = patient;
  op->data = data;
  op->n = n;
  op->parts = std::move(parts);
  if (wake.has_value()) {
    op->payload = *wake;
    op->data = &op->payload;
    op->n = sizeof(op->payload);
  }
  op->peer = peer;
  op->tag = tag;
  op->posted = absl::Now();
  op->timeout = timeout;
  absl::MutexLock lock(&mu_);
  op->generation = peer_generation_[peer];
  // The wake tag is only for wakes.
  const Parts& p = op->parts;
  const bool bad_parts =
      !p.at.empty() &&
      (p.at.size() > static_cast<size_t>(INT_MAX) ||
       (p.lengths.empty()
            ? p.block == 0 || p.block > static_cast<uint64_t>(INT_MAX)
            : p.lengths.size() != p.at.size() ||
                  std::any_of(p.lengths.begin(), p.lengths.end(), [](int l) { return l < 0; })) ||
       p.bytes() != n || std::any_of(p.at.begin(), p.at.end(), [](int64_t a) { return a < 0; }));
  if (n > static_cast<uint64_t>(INT_MAX) || peer < 0 || peer >= world_.size || tag < 0 ||
      tag > world_.tag_ub || (tag == wake_tag()) != wake.has_value() || bad_parts) {
    op->done = op->finished = true;
    op->ready.store(true);
    op->status = absl::InvalidArgumentError(
        absl::StrCat("bad MPI operation: ", n, " bytes, rank ", peer, ", tag ", tag));
    return op;
  }
  if (stop_) {
    op->done = op->finished = true;
    op->ready.store(true);
    op->status = absl::UnavailableError("daemon stopping");
    return op;
  }
  ++in_flight_;
  to_post_.push_back(op);
  return op;
}

std::shared_ptr<MpiTransport::Op> MpiTransport::Isend(const void* data, uint64_t n, int peer,
                                                      int tag) {
  return Post(true, const_cast<void*>(data), n, peer, tag, options_.op_timeout);
}

std::shared_ptr<MpiTransport::Op> MpiTransport::Irecv(void* data, uint64_t n, int peer, int tag,
                                                      bool patient) {
  return Post(false, data, n, peer, tag, patient ? absl::InfiniteDuration() : options_.op_timeout,
              patient);
}

std::shared_ptr<MpiTransport::Op> MpiTransport::IsendParts(const void* data, Parts parts, int peer,
                                                           int tag) {
  const uint64_t n = parts.bytes();
  return Post(true, const_cast<void*>(data), n, peer, tag, options_.op_timeout, false, std::nullopt,
              std::move(parts));
}

std::shared_ptr<MpiTransport::Op> MpiTransport::IrecvParts(void* data, Parts parts, int peer,
                                                           int tag, bool patient) {
  const uint64_t n = parts.bytes();
  return Post(false, data, n, peer, tag, patient ? absl::InfiniteDuration() : options_.op_timeout,
              patient, std::nullopt, std::move(parts));
}

void MpiTransport::Wake(int peer, int tag) {
  // Sent by the MPI thread like any send, and finished there; nobody waits for it.
  Post(true, nullptr, 0, peer, wake_tag(), options_.op_timeout, false, tag);
}

absl::StatusOr<uint64_t> MpiTransport::Wait(const std::shared_ptr<Op>& op) {
  return Wait(op, absl::InfiniteFuture());
}

absl::StatusOr<uint64_t> MpiTransport::Wait(const std::shared_ptr<Op>& op, absl::Time deadline) {
  if (options_.spin) {
    for (const absl::Time until = std::min(deadline, absl::Now() + absl::Microseconds(50));
         !op->ready.load(std::memory_order_acquire) && absl::Now() < until;) {
      std::this_thread::yield();
    }
  }
  absl::Status failure;
  {
    absl::MutexLock lock(&mu_);
    auto ready = [this, &op]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return op->done || peer_generation_[op->peer] != op->generation;
    };
    // The loop times operations out itself; this deadline only guards against an MPI call
    // that never returns.
    const absl::Time guard = op->posted + op->timeout + absl::Seconds(10);
    if (!mu_.AwaitWithDeadline(absl::Condition(&ready), std::min(deadline, guard))) {
      if (deadline < guard) {
        return absl::DeadlineExceededError(
            absl::StrCat("MPI operation with rank ", op->peer, " still in progress"));
      }
      failure =
          absl::UnavailableError(absl::StrCat("MPI made no progress with rank ", op->peer, " for ",
                                              absl::FormatDuration(options_.op_timeout)));
    } else if (op->done) {
      if (op->status.ok()) return op->count;
      failure = op->status;
    } else {
      failure = absl::UnavailableError(
          absl::StrCat("rank ", op->peer, " failed: ", peer_failure_[op->peer]));
    }
  }
  if (!op->send) CancelReceives({op});
  return failure;
}

void MpiTransport::CancelReceives(const std::vector<std::shared_ptr<Op>>& ops,
                                  absl::Duration wait) {
  absl::MutexLock lock(&mu_);
  for (const auto& op : ops) {
    if (!op->finished && !op->send) to_cancel_.push_back(op);
  }
  auto finished = [&ops]() {
    for (const auto& op : ops) {
      if (!op->finished && !op->send) return false;
    }
    return true;
  };
  if (mu_.AwaitWithTimeout(absl::Condition(&finished), wait)) return;
  for (const auto& op : ops) {
    if (!op->finished && !op->send) {
      LOG(WARNING) << "MPI still holds a receive from rank " << op->peer << " (tag " << op->tag
                   << ") " << absl::FormatDuration(wait) << " after cancelling it";
    }
  }
}

void MpiTransport::FailPeer(int peer, const std::string& why) {
  absl::MutexLock lock(&mu_);
  ++peer_generation_[peer];
  peer_failure_[peer] = why;
}

size_t MpiTransport::pending() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

#endif  // GPUMOVE_HAVE_MPI

}  // namespace gpumove
