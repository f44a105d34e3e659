// gpumoved started as an MPI job (mpirun -np 3): the cluster forms from MPI_COMM_WORLD and
// moves go over path MPI, verified, in every direction, big and small, concurrent, staged,
// cancelled; a rank killed mid-move fails its moves and the others keep serving.
//
// The MPI flavour comes from the environment: GPUMOVE_MPI=openmpi (default: Open MPI with
// ob1/tcp, with its UCX pml, and ob1/shared memory with every side staged) or mpich (the
// daemon then has to be built with --config=mpich; tests/run.sh does both).
#include <signal.h>

#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/gpumove_client.h"
#include "daemon/common/cpus.h"
#include "gtest/gtest.h"
#include "tests/util/daemon_process.h"
#include "tests/util/mpi_job.h"
#include "tests/util/pieces.h"
#include "tests/util/random_bytes.h"

namespace gpumove {
namespace {

using ::absl::StatusCode;

v1::BufferRef On(int rank, const std::string& id, uint64_t offset = 0, uint64_t length = 0) {
  v1::BufferRef r = Ref(id, offset, length);
  r.set_node(absl::StrCat("rank", rank));
  return r;
}

MoveOptions ViaMpi(bool wait = true) {
  MoveOptions o;
  o.path = v1::MPI;
  o.checksum = wait;
  o.wait = wait;
  return o;
}

void AwaitMembership(MpiJob& job) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  for (int r = 0; r < job.size(); ++r) {
    while (true) {
      auto peers = job.client(r).ListPeers();
      size_t up = 0;
      if (peers.ok()) {
        for (const auto& p : *peers) up += p.up();
      }
      if (up == static_cast<size_t>(job.size() - 1)) break;
      ASSERT_LT(absl::Now(), deadline) << "rank " << r << " sees " << up << " peers";
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
}

// Starts a three-rank job for each test; prints its log when the test failed.
class JobTest {
 protected:
  void StartJob(const MpiLaunch& launch, std::vector<std::string> flags = {}) {
    auto job = MpiJob::Start(3, launch, std::move(flags));
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = *std::move(job);
    AwaitMembership(*job_);
  }
  void StopJob(bool failed) {
    if (failed && job_ != nullptr) std::cerr << "job log:\n" << job_->Log();
    job_.reset();
  }
  std::unique_ptr<MpiJob> job_;
};

class MpiTest : public ::testing::TestWithParam<MpiLaunch>, protected JobTest {
 protected:
  void SetUp() override { StartJob(GetParam()); }
  void TearDown() override { StopJob(HasFailure()); }
};

TEST_P(MpiTest, TheJobIsTheCluster) {
  for (int r = 0; r < 3; ++r) {
    auto info = job_->client(r).GetInfo();
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->node(), absl::StrCat("rank", r));
    bool mpi = false;
    for (const auto& p : info->paths()) {
      if (p.path() != v1::MPI) continue;
      mpi = p.available();
      EXPECT_TRUE(absl::StrContains(p.reason(), absl::StrCat("rank ", r, " of 3"))) << p.reason();
      // The probe asks the library it runs with (symbols found at run time).
      EXPECT_TRUE(absl::StrContains(p.reason(), "MPIX_Query_cuda_support() = 0") ||
                  absl::StrContains(p.reason(), "MPIX_GPU_query_support(CUDA) = 0"))
          << p.reason();
    }
    EXPECT_TRUE(mpi);
    EXPECT_FALSE(info->mpi_cuda_aware());  // The MPI libraries tested here are host-only.
    // The library the ranks run with names itself.
    if (MpiFlavor() == "mvapich2") {
      EXPECT_TRUE(absl::StrContains(info->DebugString(), "MVAPICH2 Version : 2.3.7"))
          << info->DebugString();
    }
    auto peers = job_->client(r).ListPeers();
    ASSERT_EQ(peers->size(), 2u);
  }
}

TEST_P(MpiTest, EveryDirectionEveryWayVerified) {
  uint64_t seed = 1;
  int case_no = 0;
  for (uint64_t size : {1ull, 4097ull, (1ull << 20) + 3, (9ull << 20) + 5}) {
    for (int from = 0; from < 3; ++from) {
      for (int to = 0; to < 3; ++to) {
        if (from == to) continue;
        const int submit_at = case_no++ % 3;  // Push, pull or third party, in turn.
        SCOPED_TRACE(
            absl::StrCat("rank", from, " -> rank", to, " ", size, " bytes at rank", submit_at));
        Client& f = job_->client(from);
        Client& t = job_->client(to);
        auto src = f.Allocate(size + 16, case_no % 2 ? v1::HOST : v1::PINNED_HOST);
        auto dst = t.Allocate(size + 32, case_no % 2 ? v1::PINNED_HOST : v1::HOST);
        ASSERT_TRUE(src.ok() && dst.ok()) << src.status() << dst.status();
        const std::string data = RandomBytes(size + 16, seed++);
        const std::string before = RandomBytes(size + 32, seed++);
        ASSERT_TRUE(f.Write(Ref(src->id()), data).ok());
        ASSERT_TRUE(t.Write(Ref(dst->id()), before).ok());
        auto moved = job_->client(submit_at).Move(On(from, src->id(), 16, size),
                                                  On(to, dst->id(), 8), ViaMpi());
        ASSERT_TRUE(moved.ok()) << moved.status();
        ASSERT_EQ(moved->state(), v1::SUCCEEDED) << moved->error_message();
        EXPECT_EQ(moved->path(), v1::MPI);
        EXPECT_EQ(moved->source_xxh3(), moved->destination_xxh3());
        const std::string after = *t.Read(Ref(dst->id()));
        EXPECT_TRUE(after.substr(0, 8) == before.substr(0, 8));
        EXPECT_TRUE(after.substr(8, size) == data.substr(16, size));
        EXPECT_TRUE(after.substr(8 + size) == before.substr(8 + size));
        ASSERT_TRUE(f.Release(src->id()).ok());
        ASSERT_TRUE(t.Release(dst->id()).ok());
      }
    }
  }
}

TEST_P(MpiTest, HundredsOfMebibytes) {
  const uint64_t size = 160ull << 20;
  auto src = job_->client(2).Allocate(size);
  auto dst = job_->client(0).Allocate(size);
  ASSERT_TRUE(src.ok() && dst.ok());
  const std::string data = RandomBytes(size, 77);
  ASSERT_TRUE(job_->client(2).Write(Ref(src->id()), data).ok());
  auto moved = job_->client(1).Move(On(2, src->id()), On(0, dst->id()), ViaMpi());
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->state(), v1::SUCCEEDED) << moved->error_message();
  EXPECT_TRUE(*job_->client(0).Read(Ref(dst->id())) == data);
}

TEST_P(MpiTest, ManyConcurrentMoves) {
  constexpr int kMoves = 12;
  const uint64_t size = (3 << 20) + 11;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kMoves);
  for (int i = 0; i < kMoves; ++i) {
    threads.emplace_back([&, i] {
      const int from = i % 3;
      const int to = (i + 1 + i / 3 % 2) % 3;
      Client& f = job_->client(from);
      auto src = f.Allocate(size);
      auto dst = job_->client(to).Allocate(size);
      if (!src.ok() || !dst.ok()) {
        errors[i] = "allocate failed";
        return;
      }
      const std::string data = RandomBytes(size, 1000 + i);
      if (!f.Write(Ref(src->id()), data).ok()) errors[i] = "write failed";
      auto moved = job_->client((i + 2) % 3).Move(On(from, src->id()), On(to, dst->id()), ViaMpi());
      if (!moved.ok() || moved->state() != v1::SUCCEEDED) {
        errors[i] = moved.ok() ? moved->error_message() : moved.status().ToString();
        return;
      }
      if (*job_->client(to).Read(Ref(dst->id())) != data) errors[i] = "bytes differ";
    });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < kMoves; ++i) EXPECT_EQ(errors[i], "") << "move " << i;
}

// `moves` pushes of `part` bytes from rank 0 to rank 1 in one Submit, then as many pulls
// back in another (path MPI, checksums), all verified.
void PushAndPullInOneSubmitEach(MpiJob& job, int moves, uint64_t part, uint64_t seed) {
  auto src = job.client(0).Allocate(moves * part);
  auto mid = job.client(1).Allocate(moves * part);
  auto back = job.client(0).Allocate(moves * part);
  ASSERT_TRUE(src.ok() && mid.ok() && back.ok());
  const std::string data = RandomBytes(moves * part, seed);
  ASSERT_TRUE(job.client(0).Write(Ref(src->id()), data).ok());
  for (bool pull : {false, true}) {
    SCOPED_TRACE(pull ? "pulls" : "pushes");
    v1::SubmitRequest batch;
    batch.set_wait(true);
    for (int i = 0; i < moves; ++i) {
      auto* t = batch.add_transfers();
      t->set_path(v1::MPI);
      t->set_checksum(true);
      *t->mutable_source() =
          pull ? On(1, mid->id(), i * part, part) : On(0, src->id(), i * part, part);
      *t->mutable_destination() = pull ? On(0, back->id(), i * part) : On(1, mid->id(), i * part);
    }
    auto r = job.client(0).Submit(batch);
    ASSERT_TRUE(r.ok()) << r.status();
    for (const auto& t : r->transfers()) {
      auto end = t.state() == v1::SUCCEEDED ? absl::StatusOr<v1::Transfer>(t)
                                            : job.client(0).Wait(t.id(), absl::Seconds(60));
      ASSERT_TRUE(end.ok()) << end.status();
      EXPECT_EQ(end->state(), v1::SUCCEEDED) << end->error_message();
    }
  }
  EXPECT_TRUE(*job.client(0).Read(Ref(back->id())) == data);
}

TEST_P(MpiTest, ManyMovesInOneSubmitVerified) {
  // Forty pushes and forty pulls between two ranks, each Submit in one piece: the holds
  // of a Submit go in one batch and every remote half must still get its turn (a staged
  // half must not sit on bounce buffers while its sender waits behind others).
  PushAndPullInOneSubmitEach(*job_, 40, (1 << 20) + 7, 77);
}

// Vectored moves: each side packs its pieces, in list order, into the job's 1 MiB
// messages (tiny pieces many to a message, pieces longer than a message cut across
// several and sent from the range itself); push, pull and third party; checksums; every
// destination byte checked.
// Random pieces of three shapes (up to 4 KiB, up to 16 bytes, up to 3 MiB) pushed,
// pulled and moved third party between three ranks, every byte checked.
void MoveVectoredEveryWay(MpiJob& job, uint64_t seed) {
  struct Shape {
    size_t n;
    uint64_t slot, max_len;
  };
  const NodeEnd r0{&job.client(0), "rank0"}, r1{&job.client(1), "rank1"},
      r2{&job.client(2), "rank2"};
  struct Way {
    const NodeEnd *from, *to, *via;
  };
  for (const Shape& k :
       {Shape{2000, 4099, 4096}, Shape{20000, 17, 16}, Shape{6, (3 << 20) + 5, 3 << 20}}) {
    for (const Way& w : {Way{&r0, &r1, &r0}, Way{&r1, &r0, &r0}, Way{&r1, &r2, &r0}}) {
      ++seed;
      SCOPED_TRACE(absl::StrCat("pieces of up to ", k.max_len));
      auto pieces = RandomPieces(k.n, k.slot, k.max_len, seed);
      MoveVectoredAndCheck(*w.from, *w.to, *w.via, v1::MPI, v1::MPI, pieces, k.n * k.slot,
                           k.n * (k.slot + 3), seed);
    }
  }
}

TEST_P(MpiTest, VectoredMovesEveryWayVerified) { MoveVectoredEveryWay(*job_, 900); }

// How many times `what` occurs in `text`.
size_t Occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The job's log once the launcher has passed on what the ranks wrote: it forwards their
// output a little later, so read until two reads 200 ms apart agree (at most 10 s).
std::string QuietLog(const MpiJob& job) {
  std::string log = job.Log();
  for (const absl::Time until = absl::Now() + absl::Seconds(10); absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(200));
    std::string again = job.Log();
    if (again == log) break;
    log = std::move(again);
  }
  return log;
}

// Vectored messages of host memory as MPI derived datatypes (MPI packs and unpacks the
// pieces itself, without slots or copy threads: --mpi_datatypes=always, and auto with every
// rank on this host) and packed by copy threads through scratch slots (never). Tiny pieces
// many to a message, pieces longer than a message cut across several; push, pull and third
// party; every byte checked, and the ranks' logs show which way every vectored send and
// receive went (a staged launch stages its ranges, which are never typed).
TEST(MpiVectoredTest, DerivedDatatypeAndPackedMessagesMoveEveryPiece) {
  for (const MpiLaunch& launch : MpiLaunches()) {
    if (absl::StrContains(launch.name, "staged")) continue;
    for (const char* mode : {"always", "never"}) {
      SCOPED_TRACE(absl::StrCat(launch.name, ", --mpi_datatypes=", mode));
      auto job = MpiJob::Start(3, launch, {absl::StrCat("--mpi_datatypes=", mode), "--v=2"});
      ASSERT_TRUE(job.ok()) << job.status();
      AwaitMembership(**job);
      MoveVectoredEveryWay(**job, 990);
      const std::string log = QuietLog(**job);
      const size_t sends = Occurrences(log, "MPI vectored send to rank");
      EXPECT_GT(sends, 0u);
      EXPECT_EQ(Occurrences(log, "MPI vectored receive from rank"), sends);
      EXPECT_EQ(Occurrences(log, "derived-datatype messages"),
                std::string(mode) == "always" ? 2 * sends : 0)
          << "every vectored send and receive went " << mode;
    }
  }
  // Auto, every rank on this host: typed.
  auto job = MpiJob::Start(2, MpiLaunches().front(), {"--v=2"});
  ASSERT_TRUE(job.ok()) << job.status();
  AwaitMembership(**job);
  const NodeEnd r0{&(*job)->client(0), "rank0"}, r1{&(*job)->client(1), "rank1"};
  MoveVectoredAndCheck(r0, r1, r0, v1::MPI, v1::MPI, RandomPieces(3000, 4099, 4096, 996),
                       3000 * 4099, 3000 * 4102, 996);
  EXPECT_EQ(Occurrences(QuietLog(**job), "derived-datatype messages"), 2u)
      << "a send and a receive went typed under auto";
}

// The runner's StartMpi calls so far (its peer call histogram's count).
double StartMpiCalls(Client& c) {
  auto info = c.GetInfo();
  if (!info.ok() || info->metrics_address().empty()) return -1;
  double n = 0;
  for (absl::string_view line : absl::StrSplit(FetchMetrics(info->metrics_address()), '\n')) {
    if (absl::StartsWith(line, "gpumoved_peer_call_seconds_count{") &&
        absl::StrContains(line, "method=\"start_mpi\"")) {
      n += std::stod(std::string(line.substr(line.rfind(' ') + 1)));
    }
  }
  return n;
}

// A vectored move's half, push or pull, starts with the hold (it waits for its piece
// list, which the runner sends once ready): the runner makes no StartMpi call; a prepared
// list's pieces are kept there for its next move. Pieces of many lengths and of one (a
// block list's, one length sent for all). Every byte checked.
TEST(MpiVectoredTest, HalvesStartWithTheHold) {
  auto job = MpiJob::Start(2, MpiLaunches().front(), {"--metrics_listen=127.0.0.1:0", "--v=2"});
  ASSERT_TRUE(job.ok()) << job.status();
  AwaitMembership(**job);
  Client& c0 = (*job)->client(0);
  const NodeEnd r0{&c0, "rank0"}, r1{&(*job)->client(1), "rank1"};
  const double before = StartMpiCalls(c0);
  ASSERT_GE(before, 0);
  uint64_t seed = 970;
  for (const auto& [from, to] : {std::pair{&r0, &r1}, std::pair{&r1, &r0}}) {
    ++seed;
    for (bool uniform : {false, true}) {
      auto pieces = uniform ? Shuffled(
                                  3000, 4096, 4096, [](size_t) { return 4096; }, seed)
                            : RandomPieces(3000, 4099, 4096, seed);
      MoveVectoredAndCheck(*from, *to, r0, v1::MPI, v1::MPI, pieces, 3000 * 4099, 3000 * 4102,
                           seed);
    }
    // A prepared list too, moved again and again.
    MoveVectoredAndCheck(*from, *to, r0, v1::MPI, v1::MPI, RandomPieces(2000, 17, 16, seed),
                         2000 * 17, 2000 * 20, seed + 100, v1::HOST, v1::HOST, &r0,
                         /*repeats=*/2);
  }
  EXPECT_EQ(StartMpiCalls(c0) - before, 0);
  // A prepared list's second move each way finds the other rank's pieces kept from the
  // first (MpiAsk.list_key): no list sent, every byte still checked above.
  EXPECT_EQ(Occurrences(QuietLog(**job), "known there"), 2u);
}

TEST_P(MpiTest, PathMpiRefusesWhatItCannotServe) {
  auto a = job_->client(0).Allocate(4096);
  auto b = job_->client(0).Allocate(4096);
  ASSERT_TRUE(a.ok() && b.ok());
  // Both ends on one node: that is path LOCAL's, not MPI's.
  auto moved = job_->client(0).Move(Ref(a->id()), Ref(b->id()), ViaMpi());
  EXPECT_EQ(moved.status().code(), StatusCode::kFailedPrecondition) << moved.status();
  EXPECT_EQ(job_->client(0).GetBuffer(a->id())->active_uses(), 0u);
  // AUTO between ranks picks a path that can serve it.
  auto c = job_->client(1).Allocate(4096);
  MoveOptions o;
  o.checksum = true;
  auto any = job_->client(0).Move(Ref(a->id()), On(1, c->id()), o);
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ(any->state(), v1::SUCCEEDED);
}

INSTANTIATE_TEST_SUITE_P(Flavors, MpiTest, ::testing::ValuesIn(MpiLaunches()),
                         [](const auto& info) { return info.param.name; });

// MPI moves bytes only while polled. With Open MPI's shared memory in copy-in/copy-out
// mode (no single-copy) a message goes a fragment per poll; a receiver that napped between
// polls while a long message came took 100 times longer. Pushes wake the receiver first
// (its receives were posted with the hold, patiently); the data must land either way.
TEST(MpiWakeTest, LongMessagesIntoPatientReceivesLandAndWakeTheReceiver) {
  MpiLaunch launch = MpiLaunches().front();
  if (!HydraLauncher()) {
    launch.mpi_args = {"--mca", "pml",        "ob1",   "--mca",
                       "btl",   "self,vader", "--mca", "btl_vader_single_copy_mechanism",
                       "none"};
  }
  auto job = MpiJob::Start(2, launch, {"--mpi_chunk=32MiB", "--v=2"});
  ASSERT_TRUE(job.ok()) << job.status();
  AwaitMembership(**job);
  const uint64_t size = 96ull << 20;
  auto src = (*job)->client(0).Allocate(size);
  auto dst = (*job)->client(1).Allocate(size);
  ASSERT_TRUE(src.ok() && dst.ok());
  const std::string data = RandomBytes(size, 5);
  ASSERT_TRUE((*job)->client(0).Write(Ref(src->id()), data).ok());
  // A push (rank 1 posts its receives with the hold and is woken) and a pull back into
  // the source (the runner's own receives, no wake).
  auto pushed = (*job)->client(0).Move(On(0, src->id()), On(1, dst->id()), ViaMpi());
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(pushed->state(), v1::SUCCEEDED) << pushed->error_message();
  EXPECT_TRUE(*(*job)->client(1).Read(Ref(dst->id())) == data);
  ASSERT_TRUE((*job)->client(0).Write(Ref(src->id()), std::string(size, '\0')).ok());
  auto pulled = (*job)->client(0).Move(On(1, dst->id()), On(0, src->id()), ViaMpi());
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->state(), v1::SUCCEEDED) << pulled->error_message();
  EXPECT_TRUE(*(*job)->client(0).Read(Ref(src->id())) == data);
  const std::string log = QuietLog(**job);
  EXPECT_TRUE(absl::StrContains(log, "MPI: rank 0 starts sending tag")) << log;
}

// Staged MPI moves take bounce buffers sized to the move, on both ends alike, and the
// runner waits for its own while other moves use the pool (then starts the other end's
// half). The jobs here send 1 MiB messages, so a ring of four slots is 4 MiB and an 8 MiB
// pinned pool holds two. A Submit of 512 KiB pushes and one of pulls, four of them running
// at once, take a 516 KiB slot each; then moves of 4 MiB, four running, take turns with
// two rings a node. All land verified.
// Two ranks of the flavour's staged launch, each with an 8 MiB pinned pool (two rings of
// a 4 MiB move).
absl::StatusOr<std::unique_ptr<MpiJob>> StartStagedWithSmallPools() {
  for (const MpiLaunch& l : MpiLaunches()) {
    if (absl::EndsWith(l.name, "_staged")) return MpiJob::Start(2, l, {"--pinned_pool_size=8MiB"});
  }
  return absl::NotFoundError("no staged launch for this MPI flavour");
}

TEST(MpiStagingTest, RingsAreSizedToTheMoveAndWaitForRoom) {
  auto job = StartStagedWithSmallPools();
  ASSERT_TRUE(job.ok()) << job.status();
  AwaitMembership(**job);
  PushAndPullInOneSubmitEach(**job, 8, (512 << 10) + 7, 78);
  PushAndPullInOneSubmitEach(**job, 8, (4 << 20) + 7, 79);
  if (::testing::Test::HasFailure()) std::cerr << "job log:\n" << (*job)->Log();
}

// Each rank runs pushes to the other at once, staged, with pools that hold two rings: each
// runner holds its own rings while the other node's are all held by that node's runners.
// The other node's half fails its StartMpi at once when no ring comes free in time and the
// runner gives its ring back and starts again, so every move lands (before: the half failed
// after posting nothing and its sender waited out the 30 s operation timeout).
TEST(MpiStagingTest, RunnersPushingAtEachOtherWithFullPoolsAllLand) {
  auto job = StartStagedWithSmallPools();
  ASSERT_TRUE(job.ok()) << job.status();
  AwaitMembership(**job);
  constexpr int kMoves = 6;
  constexpr uint64_t kPart = (4 << 20) + 7;
  std::string errors[2];
  std::vector<std::thread> runners;
  for (int from = 0; from < 2; ++from) {
    runners.emplace_back([&, from] {
      const int to = 1 - from;
      Client& c = (*job)->client(from);
      auto src = c.Allocate(kMoves * kPart);
      auto dst = (*job)->client(to).Allocate(kMoves * kPart);
      if (!src.ok() || !dst.ok()) {
        errors[from] = "allocate failed";
        return;
      }
      const std::string data = RandomBytes(kMoves * kPart, 90 + from);
      if (!c.Write(Ref(src->id()), data).ok()) errors[from] = "write failed";
      v1::SubmitRequest batch;
      batch.set_wait(true);
      for (int i = 0; i < kMoves; ++i) {
        auto* t = batch.add_transfers();
        t->set_path(v1::MPI);
        t->set_checksum(true);
        *t->mutable_source() = On(from, src->id(), i * kPart, kPart);
        *t->mutable_destination() = On(to, dst->id(), i * kPart);
      }
      auto r = c.Submit(batch);
      if (!r.ok()) {
        errors[from] = r.status().ToString();
        return;
      }
      for (const auto& t : r->transfers()) {
        auto end = t.state() == v1::SUCCEEDED ? absl::StatusOr<v1::Transfer>(t)
                                              : c.Wait(t.id(), absl::Seconds(60));
        if (!end.ok() || end->state() != v1::SUCCEEDED) {
          errors[from] = end.ok() ? end->error_message() : end.status().ToString();
          return;
        }
      }
      if (*(*job)->client(to).Read(Ref(dst->id())) != data) errors[from] = "bytes differ";
    });
  }
  for (auto& th : runners) th.join();
  EXPECT_EQ(errors[0], "") << "pushes from rank 0";
  EXPECT_EQ(errors[1], "") << "pushes from rank 1";
  if (::testing::Test::HasFailure()) std::cerr << "job log:\n" << (*job)->Log();
}

// --mpi_spin (on by itself with 16 CPUs or more, asked for here): the MPI thread polls
// with nothing posted and waiters poll before blocking. Small and large moves both ways
// land verified, and the node says how its MPI thread runs.
TEST(MpiSpinTest, PollingMpiThreadAndWaitersMoveVerifiedBytes) {
  MpiLaunch launch = MpiLaunches().front();
  auto job = MpiJob::Start(2, launch, {"--mpi_spin=on"});
  ASSERT_TRUE(job.ok()) << job.status();
  AwaitMembership(**job);
  auto info = (*job)->client(1).GetInfo();
  ASSERT_TRUE(info.ok());
  bool said = false;
  for (const auto& p : info->paths()) {
    if (p.path() == v1::MPI) said = absl::StrContains(p.reason(), "--mpi_spin");
  }
  EXPECT_TRUE(said) << info->DebugString();
  PushAndPullInOneSubmitEach(**job, 8, 4096 + 7, 81);
  PushAndPullInOneSubmitEach(**job, 4, (9 << 20) + 7, 82);
  if (::testing::Test::HasFailure()) std::cerr << "job log:\n" << (*job)->Log();
}

// A library that gives less than the thread level the MPI path needs (MVAPICH2 with its
// CPU affinity on gives MPI_THREAD_SINGLE) is refused at start, naming the knob.
TEST(MpiThreadLevelTest, TooLowALevelIsRefusedNamingTheKnob) {
  if (MpiFlavor() != "mvapich2") {
    GTEST_SKIP() << MpiFlavor() << " gives MPI_THREAD_FUNNELED whatever its settings";
  }
  MpiLaunch affinity = MpiLaunches().front();
  affinity.mpi_args = {"-genv", "MV2_ENABLE_AFFINITY", "1"};  // After the launcher's 0.
  // --mpi=on: a rank that cannot run the MPI path stops (with auto it would serve without
  // it, the same reason in its info).
  const absl::Time started = absl::Now();
  auto job = MpiJob::Start(2, affinity, {"--mpi=on"});
  ASSERT_FALSE(job.ok());
  EXPECT_LT(absl::Now() - started, absl::Seconds(30));
  EXPECT_TRUE(absl::StrContains(job.status().message(), "MPI_Init_thread gave thread level SINGLE"))
      << job.status();
  EXPECT_TRUE(absl::StrContains(job.status().message(), "set MV2_ENABLE_AFFINITY=0"))
      << job.status();
}

// Launchers bind ranks to cores (Open MPI's mpirun does for two ranks unless told not to;
// asked for here so that both flavours do): a daemon's threads would share one core. The
// daemon lets them run on every CPU, unless --keep_cpu_binding.
TEST(MpiCpuTest, ALaunchersOneCoreBindingIsWidened) {
  const int all = AllowedCpus();
  if (all < 2) GTEST_SKIP() << "one CPU here";
  MpiLaunch bound = MpiLaunches().front();
  for (std::string a : HydraLauncher() ? std::vector<std::string>{"-bind-to", "core"}
                                              : std::vector<std::string>{"--bind-to", "core"}) {
    bound.mpi_args.push_back(a);
  }
  for (bool keep : {false, true}) {
    auto job = MpiJob::Start(
        2, bound,
        keep ? std::vector<std::string>{"--keep_cpu_binding"} : std::vector<std::string>{});
    ASSERT_TRUE(job.ok()) << job.status();
    for (int r = 0; r < 2; ++r) {
      auto info = (*job)->client(r).GetInfo();
      ASSERT_TRUE(info.ok()) << info.status();
      EXPECT_EQ(info->cpus(), keep ? 1 : all) << "rank " << r << " keep " << keep << "\n"
                                              << (*job)->Log();
    }
  }
}

// Cancel and rank failure, with a rate limit so that moves last long enough.
class MpiFailureTest : public ::testing::Test, protected JobTest {
 protected:
  void SetUp() override { StartJob(MpiLaunches().front(), {"--max_move_rate=48MiB"}); }
  void TearDown() override { StopJob(HasFailure()); }
  // A push and a pull (`vectored`: of 1 MiB blocks in reverse order) cancelled while they
  // run; both ends let go; the ranks then move verified bytes again. Leaves no buffers.
  void CancelPushAndPullThenMoveAgain(bool vectored);
};

TEST_F(MpiFailureTest, CancelledPushAndPullReleaseBothEndsAndLeaveNothingBehind) {
  for (bool vectored : {false, true}) {
    SCOPED_TRACE(vectored ? "vectored" : "contiguous");
    CancelPushAndPullThenMoveAgain(vectored);
    if (HasFatalFailure()) return;
  }
}

void MpiFailureTest::CancelPushAndPullThenMoveAgain(bool vectored) {
  const uint64_t size = 96 << 20;
  auto src = job_->client(0).Allocate(size);
  auto dst = job_->client(1).Allocate(size);
  auto back = job_->client(0).Allocate(size);
  ASSERT_TRUE(src.ok() && dst.ok() && back.ok());
  MoveOptions o = ViaMpi(false);
  if (vectored) {  // 1 MiB blocks in reverse order.
    o.blocks.set_block_size(1 << 20);
    for (int i = 0; i < 96; ++i) {
      o.blocks.add_source_blocks(i);
      o.blocks.add_destination_blocks(95 - i);
    }
  }
  // A push (runs at rank0) and a pull (runs at rank0, rank1 sends), both cancelled.
  auto push = job_->client(2).Move(On(0, src->id()), On(1, dst->id()), o);
  auto pull = job_->client(0).Move(On(1, dst->id()), Ref(back->id()), o);
  ASSERT_TRUE(push.ok() && pull.ok()) << push.status() << pull.status();
  absl::SleepFor(absl::Milliseconds(400));
  for (const auto* t : {&*push, &*pull}) {
    ASSERT_TRUE(job_->client(1).Cancel(t->id()).ok());
    auto end = job_->client(2).Wait(t->id(), absl::Seconds(10));
    ASSERT_TRUE(end.ok()) << end.status();
    EXPECT_EQ(end->state(), v1::CANCELLED) << end->error_message();
    EXPECT_LT(end->bytes_done(), size);
  }
  // Both ends were let go, and the same ranks and buffers move again, verified: nothing
  // of the cancelled moves is left to match the next ones.
  for (int r : {0, 1}) {
    auto buffers = job_->client(r).ListBuffers();
    ASSERT_TRUE(buffers.ok()) << buffers.status();
    for (const auto& b : *buffers) EXPECT_EQ(b.active_uses(), 0u);
  }
  const std::string data = RandomBytes(3 << 20, 5);
  ASSERT_TRUE(job_->client(0).Write(Ref(src->id()), data).ok());
  auto again = job_->client(0).Move(On(0, src->id(), 0, data.size()), On(1, dst->id()), ViaMpi());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->state(), v1::SUCCEEDED) << again->error_message();
  auto pulled = job_->client(0).Move(On(1, dst->id(), 0, data.size()), Ref(back->id()), ViaMpi());
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->state(), v1::SUCCEEDED) << pulled->error_message();
  EXPECT_TRUE(*job_->client(0).Read(Ref(back->id(), 0, data.size())) == data);
  for (int r : {0, 1}) {
    auto buffers = job_->client(r).ListBuffers();
    ASSERT_TRUE(buffers.ok()) << buffers.status();
    for (const auto& b : *buffers) ASSERT_TRUE(job_->client(r).Release(b.id()).ok());
  }
}

TEST_F(MpiFailureTest, PushesThatNeverRunLeaveNothingBehind) {
  // An MPI push's receiving half starts with its hold. A push refused with its Submit, and
  // one cancelled while queued, must still end that half (the runner says nothing will
  // come), or it would wait for ever and block the node's acknowledgements.
  const uint64_t size = 96 << 20;
  auto src = job_->client(0).Allocate(size);
  auto dst = job_->client(1).Allocate(size);
  ASSERT_TRUE(src.ok() && dst.ok());
  v1::SubmitRequest refused;
  auto* ok_move = refused.add_transfers();
  *ok_move->mutable_source() = On(0, src->id(), 0, 1 << 20);
  *ok_move->mutable_destination() = On(1, dst->id());
  ok_move->set_path(v1::MPI);
  auto* bad_move = refused.add_transfers();
  *bad_move->mutable_source() = On(0, src->id(), 1 << 20, 1 << 20);
  *bad_move->mutable_destination() = On(1, "b-missing");
  bad_move->set_path(v1::MPI);
  EXPECT_EQ(job_->client(0).Submit(refused).status().code(), StatusCode::kNotFound);

  // A long push, and a second into the same range that queues behind it; the second is
  // cancelled while queued, then the first.
  auto first = job_->client(0).Move(On(0, src->id()), On(1, dst->id()), ViaMpi(false));
  auto second = job_->client(0).Move(On(0, src->id()), On(1, dst->id()), ViaMpi(false));
  ASSERT_TRUE(first.ok() && second.ok()) << first.status() << second.status();
  EXPECT_EQ(job_->client(0).GetTransfer(second->id())->state(), v1::QUEUED);
  for (const auto* t : {&*second, &*first}) {
    ASSERT_TRUE(job_->client(0).Cancel(t->id()).ok());
    auto end = job_->client(0).Wait(t->id(), absl::Seconds(10));
    ASSERT_TRUE(end.ok()) << end.status();
    EXPECT_EQ(end->state(), v1::CANCELLED) << end->error_message();
  }
  // Nothing waits on rank1: a new push is acknowledged and verified, every hold let go.
  const std::string data = RandomBytes(3 << 20, 9);
  ASSERT_TRUE(job_->client(0).Write(Ref(src->id()), data).ok());
  auto again =
      job_->client(0).Move(On(0, src->id(), 0, data.size()), On(1, dst->id()), ViaMpi(false));
  ASSERT_TRUE(again.ok()) << again.status();
  again = job_->client(0).Wait(again->id(), absl::Seconds(15));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->state(), v1::SUCCEEDED) << again->error_message();
  EXPECT_TRUE(*job_->client(1).Read(Ref(dst->id(), 0, data.size())) == data);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  for (int r : {0, 1}) {
    auto buffers = job_->client(r).ListBuffers();
    ASSERT_TRUE(buffers.ok()) << buffers.status();
    for (const auto& b : *buffers) {
      while (job_->client(r).GetBuffer(b.id())->active_uses() != 0 && absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(20));
      }
      EXPECT_EQ(job_->client(r).GetBuffer(b.id())->active_uses(), 0u) << "rank " << r;
    }
  }
}

TEST_F(MpiFailureTest, KilledRankFailsItsMovesAndTheOthersKeepServing) {
  if (MpiFlavor() == "mpich") {
    // Measured with Debian's MPICH 4.0.2 (ch4:ucx) and -disable-auto-cleanup: the rank
    // moving bytes with the dead one aborts inside UCX (cma: process_vm_readv "No such
    // process" is fatal, MPICH does not ask UCX for error handling). Not survivable.
    GTEST_SKIP() << "MPICH 4.0.2 (ch4:ucx) aborts a rank whose peer dies mid-transfer";
  }
  if (MpiFlavor() == "mvapich2") {
    // Measured with MVAPICH2 2.3.7 (ch3:mrail over shared memory, -disable-auto-cleanup):
    // the other ranks end with the killed one (their connections closed at once).
    GTEST_SKIP() << "MVAPICH2 2.3.7 (ch3:mrail, shared memory) ends every rank when one dies";
  }
  const uint64_t size = 128 << 20;
  auto a = job_->client(1).Allocate(size);
  auto c = job_->client(2).Allocate(size);
  auto z = job_->client(0).Allocate(size);
  ASSERT_TRUE(a.ok() && c.ok() && z.ok());
  // rank1 pushes into rank2; rank0 pulls from rank2. Then rank2 dies.
  auto push = job_->client(0).Move(On(1, a->id()), On(2, c->id()), ViaMpi(false));
  auto pull = job_->client(0).Move(On(2, c->id()), Ref(z->id()), ViaMpi(false));
  ASSERT_TRUE(push.ok() && pull.ok()) << push.status() << pull.status();
  absl::SleepFor(absl::Milliseconds(500));
  const pid_t victim = job_->RankPid(2);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const absl::Time killed = absl::Now();
  for (const auto* t : {&*push, &*pull}) {
    auto end = job_->client(0).Wait(t->id(), absl::Seconds(20));
    ASSERT_TRUE(end.ok()) << end.status();
    EXPECT_EQ(end->state(), v1::FAILED) << t->id();
    EXPECT_EQ(end->error_code(), static_cast<int>(StatusCode::kUnavailable))
        << end->error_message();
  }
  EXPECT_LT(absl::Now() - killed, absl::Seconds(10));
  // rank0 and rank1 still move between themselves over MPI, verified. MPI leaves a
  // library's state after a rank's death undefined, and Open MPI's ob1 over TCP once (in
  // about 60 CI runs, a loaded machine) stopped progressing on the rank that had been
  // sending to the dead one: that move must then fail UNAVAILABLE in bounded time, with
  // no bytes claimed, and a second MPI move is tried. Either way both daemons keep
  // serving: a move between them on the path they pick lands verified.
  const std::string data = RandomBytes(5 << 20, 9);
  ASSERT_TRUE(job_->client(1).Write(Ref(a->id()), data).ok());
  int mpi_failures = 0;
  for (int attempt = 0; attempt < 2; ++attempt) {
    const absl::Time t0 = absl::Now();
    auto moved = job_->client(1).Move(On(1, a->id(), 0, data.size()), On(0, z->id()), ViaMpi());
    ASSERT_TRUE(moved.ok()) << moved.status();
    if (moved->state() == v1::SUCCEEDED) {
      EXPECT_TRUE(*job_->client(0).Read(Ref(z->id(), 0, data.size())) == data);
      break;
    }
    ++mpi_failures;
    EXPECT_EQ(moved->state(), v1::FAILED) << moved->error_message();
    EXPECT_EQ(moved->error_code(), static_cast<int>(StatusCode::kUnavailable))
        << moved->error_message();
    EXPECT_LT(absl::Now() - t0, absl::Seconds(60));
    std::cerr << "MPI move after the rank's death failed (attempt " << attempt + 1
              << "): " << moved->error_message() << "\n";
  }
  EXPECT_LT(mpi_failures, 2) << "Open MPI did not recover for a second move";
  const std::string more = RandomBytes(3 << 20, 10);
  ASSERT_TRUE(job_->client(1).Write(Ref(a->id()), more).ok());
  MoveOptions any;
  any.checksum = true;
  auto moved = job_->client(1).Move(On(1, a->id(), 0, more.size()), On(0, z->id()), any);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->state(), v1::SUCCEEDED) << moved->error_message();
  EXPECT_TRUE(*job_->client(0).Read(Ref(z->id(), 0, more.size())) == more);
  EXPECT_EQ(job_->client(1).GetBuffer(a->id())->active_uses(), 0u);
}

}  // namespace
}  // namespace gpumove
