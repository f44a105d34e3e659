// GPU suite for the CUDA-aware direct UCX path (tag "gpu"): run on the GPU machine under a
// CUDA-aware UCX (deploy/gpu/run.sh PARTS=direct sources deploy/gpu/cuda_aware_env.sh;
// without one every test says SKIPPED). Two daemons on one host, device pointers handed to
// UCX straight (no staging): device to device across nodes pushed and pulled, device to
// and from the other node's pinned memory, sizes 1 B to 1 GiB, bytes verified; the probe's
// answer in GetInfo; a cancel between requests; a node killed mid-move fails the move in
// bounded time; staging still works when forced (--ucx_force_staging). The same for path
// MPI with a CUDA-aware MPI (two ranks of one job): device pointers to MPI_Isend/Irecv.
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/gpumove_client.h"
#include "gtest/gtest.h"
#include "tests/util/daemon_process.h"
#include "tests/util/mpi_job.h"
#include "tests/util/pieces.h"
#include "tests/util/random_bytes.h"

namespace gpumove {
namespace {

v1::BufferRef On(const std::string& node, const std::string& id) {
  v1::BufferRef r = Ref(id);
  r.set_node(node);
  return r;
}

// What GetInfo says of `path` (how device memory goes, and why).
std::string PathReason(Client& c, v1::Path path) {
  auto info = c.GetInfo();
  if (!info.ok()) return "";
  for (const auto& p : info->paths()) {
    if (p.path() == path) return p.reason();
  }
  return "";
}
std::string UcxReason(Client& c) { return PathReason(c, v1::UCX); }

class GpuDirect : public ::testing::Test {
 protected:
  void Start(std::vector<std::string> extra_b = {}, std::vector<std::string> extra_a = {}) {
    std::vector<std::string> flags_a = {"--node=da", "--device_pool_size=3GiB",
                                        "--host_pool_size=64MiB", "--pinned_pool_size=1GiB"};
    flags_a.insert(flags_a.end(), extra_a.begin(), extra_a.end());
    auto a = DaemonProcess::Start(flags_a);
    ASSERT_TRUE(a.ok()) << a.status();
    a_ = *std::move(a);
    std::vector<std::string> flags = {"--node=db", "--device_pool_size=3GiB",
                                      "--host_pool_size=64MiB", "--pinned_pool_size=1GiB",
                                      "--peers=" + a_->address()};
    flags.insert(flags.end(), extra_b.begin(), extra_b.end());
    auto b = DaemonProcess::Start(flags);
    ASSERT_TRUE(b.ok()) << b.status();
    b_ = *std::move(b);
    ca_ = *Client::Connect(a_->address());
    cb_ = *Client::Connect(b_->address());
    for (int i = 0; i < 200 && (ca_->ListPeers()->empty() || !(*ca_->ListPeers())[0].up()); ++i) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    ASSERT_EQ(ca_->ListPeers()->size(), 1u);
    if (ca_->GetInfo()->gpus_size() == 0) GTEST_SKIP() << "SKIPPED: no GPU here";
  }
  bool Direct() {
    return absl::StrContains(UcxReason(*ca_), "device memory: direct (CUDA-aware UCX)");
  }
  std::unique_ptr<DaemonProcess> a_, b_;
  std::unique_ptr<Client> ca_, cb_;
};

#define SKIP_UNLESS_DIRECT()                                                                  \
  do {                                                                                        \
    if (!Direct()) {                                                                          \
      GTEST_SKIP() << "SKIPPED: UCX is not CUDA-aware here (" << UcxReason(*ca_)            \
                   << "); run under deploy/gpu/cuda_aware_env.sh";                           \
    }                                                                                         \
  } while (0)

TEST_F(GpuDirect, DeviceToDeviceAndPinnedPushedAndPulledVerified) {
  Start();
  if (HasFatalFailure() || IsSkipped()) return;
  SKIP_UNLESS_DIRECT();
  uint64_t seed = 900;
  for (uint64_t size : {1ull, 4097ull, (1ull << 20) + 3, (64ull << 20) + 1, 1ull << 30}) {
    for (bool b_device : {true, false}) {
      if (!b_device && size > (256ull << 20)) continue;  // The pinned pools' size.
      SCOPED_TRACE(absl::StrCat(size, " bytes, the other side ", b_device ? "device" : "pinned"));
      auto src = ca_->Allocate(size, v1::DEVICE, 0);
      auto far = cb_->Allocate(size, b_device ? v1::DEVICE : v1::PINNED_HOST, 0);
      auto back = ca_->Allocate(size, v1::DEVICE, 0);
      ASSERT_TRUE(src.ok() && far.ok() && back.ok())
          << src.status() << far.status() << back.status();
      const bool compare = size <= (64ull << 20) + 1;  // 1 GiB: the checksums say it.
      std::string data;
      if (compare) {
        data = RandomBytes(size, seed++);
        ASSERT_TRUE(ca_->Write(Ref(src->id()), data).ok());
      } else {
        ASSERT_TRUE(ca_->Write(Ref(src->id(), size - 4096, 4096), RandomBytes(4096, seed++)).ok());
      }
      MoveOptions o;
      o.checksum = true;
      o.path = v1::UCX;  // AUTO would take CUDA_IPC between daemons on one host.
      auto push = ca_->Move(Ref(src->id()), On("db", far->id()), o);  // da pushes.
      ASSERT_TRUE(push.ok()) << push.status();
      ASSERT_EQ(push->state(), v1::SUCCEEDED) << push->error_message();
      EXPECT_EQ(push->path(), v1::UCX);
      EXPECT_EQ(push->source_xxh3(), push->destination_xxh3());
      auto pull = ca_->Move(On("db", far->id()), Ref(back->id()), o);  // da pulls.
      ASSERT_TRUE(pull.ok()) << pull.status();
      ASSERT_EQ(pull->state(), v1::SUCCEEDED) << pull->error_message();
      EXPECT_EQ(pull->destination_xxh3(), push->source_xxh3());
      if (compare) {
        EXPECT_TRUE(*cb_->Read(Ref(far->id())) == data);
        EXPECT_TRUE(*ca_->Read(Ref(back->id())) == data);
      }
      ASSERT_TRUE(ca_->Release(src->id()).ok());
      ASSERT_TRUE(ca_->Release(back->id()).ok());
      ASSERT_TRUE(cb_->Release(far->id()).ok());
    }
  }
}

TEST_F(GpuDirect, CancelledBetweenRequestsAndBothEndsLetGo) {
  // 4 MiB device requests and a 2 GiB/s cap on db: a 1 GiB move takes half a second.
  Start({"--ucx_device_chunk=4MiB", "--max_move_rate=2GiB"});
  if (HasFatalFailure() || IsSkipped()) return;
  SKIP_UNLESS_DIRECT();
  auto src = cb_->Allocate(1ull << 30, v1::DEVICE, 0);
  auto dst = ca_->Allocate(1ull << 30, v1::DEVICE, 0);
  ASSERT_TRUE(src.ok() && dst.ok());
  MoveOptions o;
  o.path = v1::UCX;
  o.wait = false;
  auto t = cb_->Move(Ref(src->id()), On("da", dst->id()), o);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::SleepFor(absl::Milliseconds(150));
  ASSERT_TRUE(cb_->Cancel(t->id()).ok());
  auto end = cb_->Wait(t->id(), absl::Seconds(10));
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::CANCELLED) << end->error_message();
  EXPECT_LT(end->bytes_done(), 1ull << 30);
  EXPECT_EQ(cb_->GetBuffer(src->id())->active_uses(), 0u);
  EXPECT_EQ(ca_->GetBuffer(dst->id())->active_uses(), 0u);
}

TEST_F(GpuDirect, ANodeKilledMidMoveFailsItInBoundedTime) {
  // da runs the move, capped at 1 GiB/s: the kill lands mid-move.
  Start({}, {"--ucx_device_chunk=4MiB", "--max_move_rate=1GiB"});
  if (HasFatalFailure() || IsSkipped()) return;
  SKIP_UNLESS_DIRECT();
  auto src = ca_->Allocate(1ull << 30, v1::DEVICE, 0);
  auto dst = cb_->Allocate(1ull << 30, v1::DEVICE, 0);
  ASSERT_TRUE(src.ok() && dst.ok());
  MoveOptions o;
  o.path = v1::UCX;
  o.wait = false;
  auto t = ca_->Move(Ref(src->id()), On("db", dst->id()), o);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::SleepFor(absl::Milliseconds(200));
  b_->Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  auto end = ca_->Wait(t->id(), absl::Seconds(30));
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::FAILED);
  EXPECT_LT(absl::Now() - killed, absl::Seconds(15)) << "the move outlived its peer too long";
  EXPECT_EQ(ca_->GetBuffer(src->id())->active_uses(), 0u);
}

// A client's lent GPU memory (Import) over the direct UCX path: pushed from, by the node
// it was lent to (its device pointer to UCX), and pushed into by the other node (staged on
// the lender's node: no pool's UCX key covers it), verified.
TEST_F(GpuDirect, LentDeviceMemoryMovesBothWaysVerified) {
  Start();
  if (HasFatalFailure() || IsSkipped()) return;
  SKIP_UNLESS_DIRECT();
  const std::string helper = FindBuiltBinary("tests/gpu_ipc_client", "GPU_IPC_CLIENT");
  constexpr uint64_t kSize = 24ull << 20;
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t child = fork();
  if (child == 0) {
    dup2(out[1], 1);
    execl(helper.c_str(), helper.c_str(), b_->address().c_str(),
          std::to_string(kSize).c_str(), "9", nullptr);
    _exit(127);
  }
  close(out[1]);
  char line[64] = {};
  FILE* f = fdopen(out[0], "r");
  ASSERT_NE(fgets(line, sizeof(line), f), nullptr) << "helper " << helper << " printed nothing";
  std::string lent(line);
  lent.erase(lent.find_last_not_of("\n") + 1);
  auto src = ca_->Allocate(kSize, v1::DEVICE, 0);
  auto got = ca_->Allocate(kSize, v1::DEVICE, 0);
  ASSERT_TRUE(src.ok() && got.ok());
  MoveOptions o;
  o.checksum = true;
  o.path = v1::UCX;
  // db pushes the lent memory (the helper filled it with 9s) into da's device pool.
  auto out_move = cb_->Move(Ref(lent), On("da", got->id()), o);
  ASSERT_TRUE(out_move.ok()) << out_move.status();
  ASSERT_EQ(out_move->state(), v1::SUCCEEDED) << out_move->error_message();
  EXPECT_TRUE(*ca_->Read(Ref(got->id())) == std::string(kSize, '\x09'));
  // da pushes new bytes into the lent memory on db.
  const std::string data = RandomBytes(kSize, 4242);
  ASSERT_TRUE(ca_->Write(Ref(src->id()), data).ok());
  auto in_move = ca_->Move(Ref(src->id()), On("db", lent), o);
  ASSERT_TRUE(in_move.ok()) << in_move.status();
  ASSERT_EQ(in_move->state(), v1::SUCCEEDED) << in_move->error_message();
  EXPECT_TRUE(*cb_->Read(Ref(lent)) == data);
  // And da pulls it back out of the lent memory.
  auto pull = ca_->Move(On("db", lent), Ref(got->id()), o);
  ASSERT_TRUE(pull.ok()) << pull.status();
  ASSERT_EQ(pull->state(), v1::SUCCEEDED) << pull->error_message();
  EXPECT_TRUE(*ca_->Read(Ref(got->id())) == data);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  fclose(f);
}

TEST_F(GpuDirect, StagingStillWorksWhenForced) {
  Start({"--ucx_force_staging"});
  if (HasFatalFailure() || IsSkipped()) return;
  SKIP_UNLESS_DIRECT();
  EXPECT_TRUE(absl::StrContains(UcxReason(*cb_), "staged (--ucx_force_staging)"))
      << UcxReason(*cb_);
  const uint64_t size = (48ull << 20) + 7;
  auto src = ca_->Allocate(size, v1::DEVICE, 0);
  auto dst = cb_->Allocate(size, v1::DEVICE, 0);
  ASSERT_TRUE(src.ok() && dst.ok());
  const std::string data = RandomBytes(size, 77);
  ASSERT_TRUE(ca_->Write(Ref(src->id()), data).ok());
  MoveOptions o;
  o.checksum = true;
  o.path = v1::UCX;
  auto m = ca_->Move(Ref(src->id()), On("db", dst->id()), o);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->state(), v1::SUCCEEDED) << m->error_message();
  EXPECT_TRUE(*cb_->Read(Ref(dst->id())) == data);
}

std::string MpiReason(Client& c) { return PathReason(c, v1::MPI); }

// Two ranks of one MPI job; SKIPPED unless their MPI takes device pointers (or, with
// `staged`, checks that the ranks say they stage).
class GpuDirectMpi : public ::testing::Test {
 protected:
  void Start(std::vector<std::string> extra = {}) {
    std::vector<std::string> flags = {"--device_pool_size=3GiB", "--pinned_pool_size=512MiB",
                                      "--host_pool_size=512MiB", "--noucx"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    auto job = MpiJob::Start(2, MpiLaunch{"default", {}, {}}, flags);
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = *std::move(job);
    for (int i = 0; i < 200 && job_->client(0).ListPeers()->empty(); ++i) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    if (job_->client(0).GetInfo()->gpus_size() == 0) GTEST_SKIP() << "SKIPPED: no GPU here";
    const std::string reason = MpiReason(job_->client(0));
    if (!absl::StrContains(reason, "device memory: direct") &&
        !absl::StrContains(reason, "MPI is CUDA-aware")) {
      GTEST_SKIP() << "SKIPPED: MPI is not CUDA-aware here (" << MpiReason(job_->client(0))
                   << "); run under deploy/gpu/cuda_aware_env.sh";
    }
  }
  std::unique_ptr<MpiJob> job_;
};

TEST_F(GpuDirectMpi, DeviceToDeviceAndPinnedPushedAndPulledVerified) {
  Start();
  if (HasFatalFailure() || IsSkipped()) return;
  Client& c0 = job_->client(0);
  Client& c1 = job_->client(1);
  ASSERT_TRUE(absl::StrContains(MpiReason(c0), "device memory: direct (CUDA-aware MPI"))
      << MpiReason(c0);
  uint64_t seed = 1900;
  for (uint64_t size : {1ull, (5ull << 20) + 3, (300ull << 20) + 1, 1ull << 30}) {
    for (bool far_device : {true, false}) {
      if (!far_device && size > (256ull << 20)) continue;  // The pinned pools' size.
      SCOPED_TRACE(absl::StrCat(size, " bytes, the other side ", far_device ? "device" : "pinned"));
      auto src = c0.Allocate(size, v1::DEVICE, 0);
      auto far = c1.Allocate(size, far_device ? v1::DEVICE : v1::PINNED_HOST, 0);
      auto back = c0.Allocate(size, v1::DEVICE, 0);
      ASSERT_TRUE(src.ok() && far.ok() && back.ok())
          << src.status() << far.status() << back.status();
      const bool compare = size < (1ull << 30);
      std::string data;
      if (compare) {
        data = RandomBytes(size, seed++);
        ASSERT_TRUE(c0.Write(Ref(src->id()), data).ok());
      }
      MoveOptions o;
      o.checksum = true;
      o.path = v1::MPI;
      auto push = c0.Move(Ref(src->id()), On("rank1", far->id()), o);
      ASSERT_TRUE(push.ok()) << push.status();
      ASSERT_EQ(push->state(), v1::SUCCEEDED) << push->error_message();
      EXPECT_EQ(push->source_xxh3(), push->destination_xxh3());
      auto pull = c0.Move(On("rank1", far->id()), Ref(back->id()), o);
      ASSERT_TRUE(pull.ok()) << pull.status();
      ASSERT_EQ(pull->state(), v1::SUCCEEDED) << pull->error_message();
      EXPECT_EQ(pull->destination_xxh3(), push->source_xxh3());
      if (compare) {
        EXPECT_TRUE(*c1.Read(Ref(far->id())) == data);
        EXPECT_TRUE(*c0.Read(Ref(back->id())) == data);
      }
      ASSERT_TRUE(c0.Release(src->id()).ok());
      ASSERT_TRUE(c0.Release(back->id()).ok());
      ASSERT_TRUE(c1.Release(far->id()).ok());
    }
  }
  // Vectored: each rank packs its pieces with one GPU gather or scatter a message into
  // device scratch slots the CUDA-aware MPI sends from; pieces longer than a message go
  // from the range itself. Device <-> device both ways, device -> pinned.
  for (const auto& [n, slot, max_len] : {std::tuple<size_t, uint64_t, uint64_t>{20000, 17, 16},
                                        {2000, 4099, 4096},
                                        {6, (40 << 20) + 5, 40 << 20}}) {
    const NodeEnd r0{&c0, "rank0"}, r1{&c1, "rank1"};
    for (const auto& [from, to, to_kind] : {std::tuple{r0, r1, v1::DEVICE},
                                            {r1, r0, v1::DEVICE},
                                            {r0, r1, v1::PINNED_HOST}}) {
      MoveVectoredAndCheck(from, to, r0, v1::MPI, v1::MPI, RandomPieces(n, slot, max_len, seed),
                           n * slot, n * (slot + 3), seed, v1::DEVICE, to_kind);
      ++seed;
    }
  }
}

// A prepared list's messages keep their gather and scatter descriptors on the runner's
// GPU (keyed by list, chunk, message and direction): moved again and again, pushed (the
// runner packs) and pulled (it unpacks), in many messages, fresh bytes every time.
TEST_F(GpuDirectMpi, PreparedListsMoveAgainWithKeptMessageDescriptors) {
  Start({"--mpi_chunk=1MiB", "--mpi_device_chunk=1MiB"});
  if (HasFatalFailure() || IsSkipped()) return;
  Client& c0 = job_->client(0);
  Client& c1 = job_->client(1);
  const NodeEnd r0{&c0, "rank0"}, r1{&c1, "rank1"};
  uint64_t seed = 2700;
  for (const auto& [n, slot, max_len] :
       {std::tuple<size_t, uint64_t, uint64_t>{20000, 17, 16}, {2000, 4099, 4096}}) {
    for (const auto& [from, to] : {std::pair{r0, r1}, {r1, r0}}) {
      MoveVectoredAndCheck(from, to, r0, v1::MPI, v1::MPI, RandomPieces(n, slot, max_len, seed),
                           n * slot, n * (slot + 3), seed, v1::DEVICE, v1::DEVICE, &r0,
                           /*repeats=*/3);
      seed += 10;
    }
  }
}

TEST_F(GpuDirectMpi, CancelledBetweenMessagesAndBothEndsLetGo) {
  Start({"--mpi_device_chunk=4MiB", "--max_move_rate=2GiB"});
  if (HasFatalFailure() || IsSkipped()) return;
  Client& c0 = job_->client(0);
  Client& c1 = job_->client(1);
  auto src = c0.Allocate(1ull << 30, v1::DEVICE, 0);
  auto dst = c1.Allocate(1ull << 30, v1::DEVICE, 0);
  ASSERT_TRUE(src.ok() && dst.ok());
  MoveOptions o;
  o.path = v1::MPI;
  o.wait = false;
  auto t = c0.Move(Ref(src->id()), On("rank1", dst->id()), o);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::SleepFor(absl::Milliseconds(150));
  ASSERT_TRUE(c0.Cancel(t->id()).ok());
  auto end = c0.Wait(t->id(), absl::Seconds(15));
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::CANCELLED) << end->error_message();
  EXPECT_LT(end->bytes_done(), 1ull << 30);
  // Both ranks let go, and the same buffers take a full move afterwards.
  for (int i = 0; i < 100 && c1.GetBuffer(dst->id())->active_uses() > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(c0.GetBuffer(src->id())->active_uses(), 0u);
  EXPECT_EQ(c1.GetBuffer(dst->id())->active_uses(), 0u);
  o.wait = true;
  o.checksum = true;
  auto again = c0.Move(Ref(src->id()), On("rank1", dst->id()), o);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->state(), v1::SUCCEEDED) << again->error_message();
}

// A rank killed in the middle of a direct move of device memory: the move fails
// UNAVAILABLE in bounded time at the rank that runs it, which keeps serving (the launcher
// runs with --enable-recovery, as a job of daemons should).
TEST_F(GpuDirectMpi, AKilledRankFailsTheMoveInBoundedTimeAndTheOtherKeepsServing) {
  Start({"--mpi_device_chunk=4MiB", "--max_move_rate=2GiB"});
  if (HasFatalFailure() || IsSkipped()) return;
  Client& c0 = job_->client(0);
  Client& c1 = job_->client(1);
  auto src = c0.Allocate(1ull << 30, v1::DEVICE, 0);
  auto dst = c1.Allocate(1ull << 30, v1::DEVICE, 0);
  ASSERT_TRUE(src.ok() && dst.ok());
  MoveOptions o;
  o.path = v1::MPI;
  o.wait = false;
  auto t = c0.Move(Ref(src->id()), On("rank1", dst->id()), o);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::SleepFor(absl::Milliseconds(200));
  const pid_t victim = job_->RankPid(1);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const absl::Time killed = absl::Now();
  auto end = c0.Wait(t->id(), absl::Seconds(30));
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::FAILED) << end->error_message();
  EXPECT_EQ(end->error_code(), static_cast<int>(absl::StatusCode::kUnavailable))
      << end->error_message();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(10));
  EXPECT_LT(end->bytes_done(), 1ull << 30);
  // Rank 0 still serves: a device move of its own, verified, and its buffer let go.
  auto back = c0.Allocate(5 << 20, v1::DEVICE, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  const std::string data = RandomBytes(5 << 20, 77);
  ASSERT_TRUE(c0.Write(Ref(src->id(), 0, data.size()), data).ok());
  auto local = c0.Move(Ref(src->id(), 0, data.size()), Ref(back->id()));
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->state(), v1::SUCCEEDED) << local->error_message();
  EXPECT_TRUE(*c0.Read(Ref(back->id())) == data);
  EXPECT_EQ(c0.GetBuffer(src->id())->active_uses(), 0u);
}

TEST_F(GpuDirectMpi, StagingStillWorksWhenForced) {
  Start({"--mpi_force_staging"});
  if (HasFatalFailure() || IsSkipped()) return;
  Client& c0 = job_->client(0);
  Client& c1 = job_->client(1);
  EXPECT_TRUE(absl::StrContains(MpiReason(c0), "staged through pinned bounce buffers "
                                               "(--mpi_force_staging; MPI is CUDA-aware"))
      << MpiReason(c0);
  const uint64_t size = (48ull << 20) + 7;
  auto src = c0.Allocate(size, v1::DEVICE, 0);
  auto dst = c1.Allocate(size, v1::DEVICE, 0);
  ASSERT_TRUE(src.ok() && dst.ok());
  const std::string data = RandomBytes(size, 79);
  ASSERT_TRUE(c0.Write(Ref(src->id()), data).ok());
  MoveOptions o;
  o.checksum = true;
  o.path = v1::MPI;
  auto m = c0.Move(Ref(src->id()), On("rank1", dst->id()), o);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->state(), v1::SUCCEEDED) << m->error_message();
  EXPECT_TRUE(*c1.Read(Ref(dst->id())) == data);
}

}  // namespace
}  // namespace gpumove
