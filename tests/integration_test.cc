// A real gpumoved driven through the C++ client: data lands, bad input is refused with
// the right code and changes nothing, cancel, leases and SIGTERM drain behave.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <memory>

#include <grpcpp/generic/generic_stub.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "client/gpumove_client.h"
#include "gtest/gtest.h"
#include "tests/util/daemon_process.h"
#include "tests/util/random_bytes.h"

namespace gpumove {
namespace {

using ::absl::StatusCode;

class Daemon {
 public:
  explicit Daemon(std::vector<std::string> flags = {}) {
    flags.push_back("--host_pool_size=512MiB");
    flags.push_back("--pinned_pool_size=64MiB");
    auto p = DaemonProcess::Start(flags);
    EXPECT_TRUE(p.ok()) << p.status();
    process = *std::move(p);
    auto c = Client::Connect(process->address());
    EXPECT_TRUE(c.ok()) << c.status();
    client = *std::move(c);
  }
  std::string Alloc(uint64_t size, v1::MemoryKind kind = v1::HOST,
                    absl::Duration lease = absl::ZeroDuration()) {
    auto b = client->Allocate(size, kind, 0, lease);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? b->id() : "";
  }
  std::string Contents(const std::string& id) { return *client->Read(Ref(id)); }

  std::unique_ptr<DaemonProcess> process;
  std::unique_ptr<Client> client;
};

TEST(Integration, MovesVerifiedBytesBetweenHostAndPinnedAtManySizes) {
  Daemon d;
  uint64_t seed = 1;
  for (uint64_t size : {1ull, 7ull, 4095ull, 4096ull, (1ull << 20) + 3, 48ull << 20}) {
    for (auto [sk, dk] : {std::pair{v1::HOST, v1::PINNED_HOST}, std::pair{v1::PINNED_HOST, v1::HOST},
                          std::pair{v1::HOST, v1::HOST}}) {
      SCOPED_TRACE(absl::StrCat("size ", size, " ", v1::MemoryKind_Name(sk), " -> ",
                                v1::MemoryKind_Name(dk)));
      const uint64_t pad = 100;
      std::string src = d.Alloc(size + pad, sk), dst = d.Alloc(size + 2 * pad, dk);
      std::string data = RandomBytes(size + pad, seed++);
      std::string before = RandomBytes(size + 2 * pad, seed++);
      ASSERT_TRUE(d.client->Write(Ref(src), data).ok());
      ASSERT_TRUE(d.client->Write(Ref(dst), before).ok());
      MoveOptions options;
      options.checksum = true;
      auto t = d.client->Move(Ref(src, pad, size), Ref(dst, pad), options);
      ASSERT_TRUE(t.ok()) << t.status();
      EXPECT_EQ(t->state(), v1::SUCCEEDED) << t->error_message();
      EXPECT_EQ(t->bytes_done(), size);
      EXPECT_EQ(t->path(), v1::LOCAL);
      EXPECT_EQ(t->source_xxh3(), t->destination_xxh3());
      std::string after = d.Contents(dst);
      EXPECT_TRUE(after.substr(0, pad) == before.substr(0, pad));
      EXPECT_TRUE(after.substr(pad, size) == data.substr(pad, size));
      EXPECT_TRUE(after.substr(pad + size) == before.substr(pad + size));
      ASSERT_TRUE(d.client->Release(src).ok());
      ASSERT_TRUE(d.client->Release(dst).ok());
    }
  }
}

TEST(Integration, ReadsAnyOffsetAndLength) {
  Daemon d;
  std::string b = d.Alloc(3 << 20);
  std::string data = RandomBytes(3 << 20, 9);
  auto w = d.client->Write(Ref(b), data);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->bytes_written(), data.size());
  EXPECT_EQ(*d.client->Read(Ref(b, 12345, 2 << 20)), data.substr(12345, 2 << 20));
  EXPECT_EQ(*d.client->Read(Ref(b, (3 << 20) - 1)), data.substr((3 << 20) - 1));
  auto w2 = d.client->Write(Ref(b, 17), "hello");
  ASSERT_TRUE(w2.ok());
  EXPECT_EQ(d.client->Read(Ref(b, 17, 5)).value(), "hello");
}

TEST(Integration, BadInputGetsItsCodeAndChangesNothing) {
  Daemon d;
  std::string a = d.Alloc(4096), b = d.Alloc(1024);
  std::string a_data = RandomBytes(4096, 3), b_data = RandomBytes(1024, 4);
  ASSERT_TRUE(d.client->Write(Ref(a), a_data).ok());
  ASSERT_TRUE(d.client->Write(Ref(b), b_data).ok());
  auto move_code = [&](v1::BufferRef s, v1::BufferRef t, v1::Path path = v1::PATH_AUTO) {
    MoveOptions o;
    o.path = path;
    return d.client->Move(s, t, o).status().code();
  };
  v1::BufferRef elsewhere = Ref(b);
  elsewhere.set_node("no-such-node");

  // Allocation.
  EXPECT_EQ(d.client->Allocate(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.client->Allocate(1ull << 62).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.client->Allocate(UINT64_MAX).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.client->Allocate(16, static_cast<v1::MemoryKind>(42)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(d.client->Allocate(16, v1::DEVICE).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.client->Allocate(500 << 20).status().code(), StatusCode::kOk);
  EXPECT_EQ(d.client->Allocate(100 << 20).status().code(), StatusCode::kResourceExhausted);
  // Buffers.
  EXPECT_EQ(d.client->GetBuffer("b-nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(d.client->Release("b-nope").code(), StatusCode::kNotFound);
  EXPECT_EQ(d.client->RenewLease(a).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.client->Read(Ref(a, 4096)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.client->Read(Ref(a, 1, UINT64_MAX)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.client->Read(Ref("b-nope")).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(d.client->Write(Ref(b, 1000), std::string(25, 'x')).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(d.client->Write(Ref(b, UINT64_MAX - 2), std::string(25, 'x')).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(d.client->Write(elsewhere, "x").status().code(), StatusCode::kNotFound);
  // Moves.
  EXPECT_EQ(move_code(Ref(a), Ref(b)), StatusCode::kInvalidArgument);  // 4096 into 1024.
  EXPECT_EQ(move_code(Ref(a, 0, 100), Ref(b, 1000)), StatusCode::kInvalidArgument);
  EXPECT_EQ(move_code(Ref(a, 5000), Ref(b)), StatusCode::kInvalidArgument);
  EXPECT_EQ(move_code(Ref(a, 8, UINT64_MAX - 4), Ref(b)), StatusCode::kInvalidArgument);
  EXPECT_EQ(move_code(Ref(a, 0, 10), Ref(b, UINT64_MAX - 5)), StatusCode::kInvalidArgument);
  EXPECT_EQ(move_code(Ref(a, 0, 100), Ref(a, 50)), StatusCode::kInvalidArgument);
  EXPECT_EQ(move_code(Ref("b-nope"), Ref(b)), StatusCode::kNotFound);
  EXPECT_EQ(move_code(Ref(a, 0, 10), Ref("b-nope")), StatusCode::kNotFound);
  EXPECT_EQ(move_code(Ref(""), Ref(b)), StatusCode::kInvalidArgument);
  EXPECT_EQ(move_code(Ref(a, 0, 10), elsewhere), StatusCode::kNotFound);
  EXPECT_EQ(move_code(Ref(a, 0, 10), Ref(b), v1::UCX), StatusCode::kFailedPrecondition);
  EXPECT_EQ(move_code(Ref(a, 0, 10), Ref(b), static_cast<v1::Path>(99)),
            StatusCode::kInvalidArgument);
  v1::BufferRef mismatched = Ref(b, 0, 11);
  EXPECT_EQ(move_code(Ref(a, 0, 10), mismatched), StatusCode::kInvalidArgument);
  v1::SubmitRequest empty;
  EXPECT_EQ(d.client->Submit(empty).status().code(), StatusCode::kInvalidArgument);
  // Transfers.
  EXPECT_EQ(d.client->GetTransfer("t-nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(d.client->Cancel("t-nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(d.client->Wait("t-nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(d.client->Watch("t-nope", nullptr).status().code(), StatusCode::kNotFound);

  EXPECT_EQ(d.Contents(a), a_data);
  EXPECT_EQ(d.Contents(b), b_data);
  EXPECT_TRUE(d.client->ListTransfers()->empty());
  EXPECT_EQ(d.client->GetBuffer(a)->active_uses(), 0u);
}

TEST(Integration, BatchOfOverlappingMovesAppliesInSubmissionOrder) {
  Daemon d({"--copy_threads=8"});
  EXPECT_EQ(d.client->GetInfo()->workers(), 8u);
  std::string x = d.Alloc(1 << 20), y = d.Alloc(1 << 20), z = d.Alloc(1 << 20);
  ASSERT_TRUE(d.client->Write(Ref(x), std::string(1 << 20, 'x')).ok());
  ASSERT_TRUE(d.client->Write(Ref(y), std::string(1 << 20, 'y')).ok());
  v1::SubmitRequest r;
  for (int i = 0; i < 20; ++i) {
    v1::TransferSpec* s = r.add_transfers();
    *s->mutable_source() = Ref(i % 2 == 0 ? x : y);
    *s->mutable_destination() = Ref(z);
  }
  r.set_wait(true);
  auto done = d.client->Submit(r);
  ASSERT_TRUE(done.ok()) << done.status();
  for (const auto& t : done->transfers()) EXPECT_EQ(t.state(), v1::SUCCEEDED);
  EXPECT_EQ(d.Contents(z), std::string(1 << 20, 'y'));  // The last one wins.
}

TEST(Integration, IdempotencyKeyMakesRetriesSafe) {
  Daemon d;
  std::string a = d.Alloc(4096), b = d.Alloc(4096);
  MoveOptions o;
  o.idempotency_key = "retry-me";
  auto first = d.client->Move(Ref(a), Ref(b), o);
  auto second = d.client->Move(Ref(a), Ref(b), o);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->id(), second->id());
  EXPECT_EQ(d.client->ListTransfers()->size(), 1u);
}

TEST(Integration, CancelStopsARunningMove) {
  Daemon d({"--max_move_rate=32MiB"});
  std::string a = d.Alloc(64 << 20), b = d.Alloc(64 << 20);
  ASSERT_TRUE(d.client->Write(Ref(a), std::string(64 << 20, 'a')).ok());
  MoveOptions o;
  o.wait = false;
  auto t = d.client->Move(Ref(a), Ref(b), o);
  ASSERT_TRUE(t.ok());
  while (d.client->GetTransfer(t->id())->bytes_done() == 0) absl::SleepFor(absl::Milliseconds(5));
  auto c = d.client->Cancel(t->id());
  ASSERT_TRUE(c.ok());
  auto end = d.client->Wait(t->id(), absl::Seconds(10));
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(end->state(), v1::CANCELLED);
  EXPECT_EQ(end->error_code(), static_cast<int>(StatusCode::kCancelled));
  EXPECT_GT(end->bytes_done(), 0u);
  EXPECT_LT(end->bytes_done(), 64u << 20);
  EXPECT_EQ(d.client->Read(Ref(b, (64 << 20) - 1))->at(0), '\0');  // The tail never came.
  EXPECT_TRUE(d.client->Release(a).ok());  // No longer in use.
}

// A cancel answered at once says it is under way (the move is still RUNNING, its buffers
// in use); one that waits answers once the move has ended, and the buffers are free then.
TEST(Integration, CancelSaysItIsUnderWayOrWaitsForTheEnd) {
  Daemon d({"--max_move_rate=32MiB"});
  std::string a = d.Alloc(64 << 20), b = d.Alloc(64 << 20);
  MoveOptions o;
  o.wait = false;
  auto t = d.client->Move(Ref(a), Ref(b), o);
  ASSERT_TRUE(t.ok());
  for (int i = 0; i < 400 && d.client->GetTransfer(t->id())->bytes_done() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  // The engine checks for a cancel between chunks: an answer at once may still be RUNNING.
  auto at_once = d.client->Cancel(t->id(), /*wait=*/false);
  ASSERT_TRUE(at_once.ok());
  if (at_once->state() == v1::RUNNING) EXPECT_TRUE(at_once->cancel_requested());
  auto waited = d.client->Cancel(t->id(), /*wait=*/true, absl::Seconds(10));
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(waited->state(), v1::CANCELLED);
  EXPECT_FALSE(waited->cancel_requested());
  EXPECT_TRUE(d.client->Release(a).ok());  // Free the moment the answer came.
  EXPECT_TRUE(d.client->Release(b).ok());
}

// A lone move for a caller that waits only so long is answered at that time, whatever
// path would have run it (a rate-capped move once ran inline past the caller's timeout).
TEST(Integration, ALoneMoveHonoursItsWaitTimeout) {
  Daemon d({"--max_move_rate=16MiB"});
  std::string a = d.Alloc(32 << 20), b = d.Alloc(32 << 20);
  v1::SubmitRequest request;
  v1::TransferSpec* spec = request.add_transfers();
  *spec->mutable_source() = Ref(a);
  *spec->mutable_destination() = Ref(b);
  request.set_wait(true);
  request.mutable_wait_timeout()->set_nanos(300'000'000);
  auto stub = v1::TransferService::NewStub(
      grpc::CreateChannel(d.process->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::SubmitResponse response;
  const absl::Time start = absl::Now();
  grpc::Status st = stub->Submit(&context, request, &response);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << st.error_message();
  EXPECT_LT(took, absl::Milliseconds(1200)) << "2 s of bytes at 16 MiB/s; asked to wait 0.3 s";
}

int Threads(pid_t pid) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"))) {
    (void)e;
    ++n;
  }
  return n;
}

// Waits whose callers hang up are let go at once, not when the transfer ends (each
// blocked Wait once kept a daemon thread to the end of its move; now none holds a thread,
// and a hung-up one gives back its open-call place and leaves no thread behind).
TEST(Integration, WaitsWhoseCallersHangUpLetTheirThreadsGo) {
  Daemon d({"--max_move_rate=8MiB", "--metrics_listen=127.0.0.1:0"});
  std::string a = d.Alloc(64 << 20), b = d.Alloc(64 << 20);  // 8 s of bytes.
  MoveOptions o;
  o.wait = false;
  auto t = d.client->Move(Ref(a), Ref(b), o);
  ASSERT_TRUE(t.ok());
  // A wait that times out first: the shared timer the waits use is up before counting.
  EXPECT_EQ(d.client->Wait(t->id(), absl::Milliseconds(10)).status().code(),
            StatusCode::kDeadlineExceeded);
  const int idle = Threads(d.process->pid());
  const std::string metrics = d.client->GetInfo()->metrics_address();
  auto stub = v1::TransferService::NewStub(
      grpc::CreateChannel(d.process->address(), grpc::InsecureChannelCredentials()));
  constexpr int kWaiters = 40;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    waiters.emplace_back([&, c = contexts.back().get()] {
      v1::WaitRequest request;
      request.set_id(t->id());
      v1::Transfer out;
      grpc::Status st = stub->Wait(c, request, &out);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::CANCELLED) << st.error_message();
    });
  }
  double open = 0;
  for (int i = 0; i < 250 && (open = MetricValue(metrics, "open_calls")) < kWaiters; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(open, kWaiters) << "the waits never were open at once";
  const int busy = Threads(d.process->pid());
  for (auto& c : contexts) c->TryCancel();
  for (auto& w : waiters) w.join();
  int after = busy;
  // gRPC's bounded pools may start a few threads for the 40 hang-ups; one a waiter kept
  // would be 40.
  for (int i = 0; i < 100 && (after = Threads(d.process->pid())) > idle + 8; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_LE(after, idle + 8) << "threads: " << idle << " idle, " << busy << " waiting, " << after
                             << " after the waiters hung up";
  for (int i = 0; i < 250 && (open = MetricValue(metrics, "open_calls")) > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(open, 0) << "hung-up waits kept their places";
  EXPECT_EQ(d.client->GetTransfer(t->id())->state(), v1::RUNNING);  // Still going.
  EXPECT_TRUE(d.client->Cancel(t->id(), /*wait=*/true).ok());
}

// Streams and waits are capped per principal (each keeps memory, listeners and a timer):
// one past the cap is RESOURCE_EXHAUSTED at once, and a closed one gives its place back.
TEST(Integration, OpenStreamsAndWaitsAreCappedPerPrincipal) {
  Daemon d({"--max_open_calls_per_principal=3"});
  std::vector<std::unique_ptr<NotificationStream>> open;
  for (int i = 0; i < 3; ++i) {
    auto s = d.client->Subscribe(v1::NotificationsRequest(), absl::Seconds(30));
    ASSERT_TRUE(s.ok()) << s.status();
    open.push_back(*std::move(s));
  }
  auto stub = v1::TransferService::NewStub(
      grpc::CreateChannel(d.process->address(), grpc::InsecureChannelCredentials()));
  v1::NotificationsRequest request;
  grpc::ClientContext context;
  auto reader = stub->Notifications(&context, request);
  v1::Notification n;
  EXPECT_FALSE(reader->Read(&n));
  grpc::Status st = reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_TRUE(absl::StrContains(st.error_message(), "--max_open_calls_per_principal"))
      << st.error_message();
  // A wait counts as well; calls that end at once do not.
  EXPECT_EQ(d.client->Wait("t-missing", absl::Seconds(1)).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_TRUE(d.client->ListBuffers().ok());
  open[0]->Cancel();
  open[0]->Finish().IgnoreError();
  open.erase(open.begin());
  bool again = false;
  for (int i = 0; i < 50 && !again; ++i) {  // The server sees the cancel shortly.
    again = d.client->Wait("t-missing", absl::Seconds(1)).status().code() ==
            StatusCode::kNotFound;
    if (!again) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(again) << "a closed stream did not give its place back";
}

TEST(Integration, CancelOfAQueuedMoveEndsItAtOnce) {
  Daemon d({"--max_move_rate=32MiB", "--copy_threads=1"});
  std::string a = d.Alloc(32 << 20), b = d.Alloc(32 << 20), c = d.Alloc(4096), e = d.Alloc(4096);
  MoveOptions o;
  o.wait = false;
  auto slow = d.client->Move(Ref(a), Ref(b), o);
  auto queued = d.client->Move(Ref(c), Ref(e), o);
  ASSERT_TRUE(slow.ok() && queued.ok());
  auto cancelled = d.client->Cancel(queued->id());
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  EXPECT_EQ(d.client->Cancel(slow->id())->id(), slow->id());
  EXPECT_EQ(d.client->Wait(slow->id(), absl::Seconds(10))->state(), v1::CANCELLED);
}

TEST(Integration, WatchStreamsProgressUntilTheEnd) {
  Daemon d({"--max_move_rate=64MiB"});
  std::string a = d.Alloc(64 << 20), b = d.Alloc(64 << 20);
  MoveOptions o;
  o.wait = false;
  auto t = d.client->Move(Ref(a), Ref(b), o);
  ASSERT_TRUE(t.ok());
  std::vector<v1::Transfer> events;
  auto end = d.client->Watch(t->id(), [&](const v1::Transfer& e) { events.push_back(e); },
                             absl::Milliseconds(50));
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::SUCCEEDED);
  ASSERT_GE(events.size(), 4u);
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_GE(events[i].bytes_done(), events[i - 1].bytes_done());
  }
  EXPECT_EQ(events.back().bytes_done(), 64u << 20);
}

TEST(Integration, QueueFullIsResourceExhausted) {
  Daemon d({"--max_move_rate=16MiB", "--copy_threads=1", "--max_active=2"});
  std::string a = d.Alloc(16 << 20), b = d.Alloc(16 << 20), c = d.Alloc(16 << 20);
  MoveOptions o;
  o.wait = false;
  auto t1 = d.client->Move(Ref(a), Ref(b), o);
  auto t2 = d.client->Move(Ref(a), Ref(c), o);
  ASSERT_TRUE(t1.ok() && t2.ok());
  EXPECT_EQ(d.client->Move(Ref(b), Ref(c), o).status().code(), StatusCode::kResourceExhausted);
  d.client->Cancel(t1->id()).IgnoreError();
  d.client->Cancel(t2->id()).IgnoreError();
}

TEST(Integration, ExpiredLeaseFreesTheBufferAndRenewKeepsIt) {
  Daemon d;
  std::string doomed = d.Alloc(4096, v1::HOST, absl::Seconds(1));
  std::string kept = d.Alloc(4096, v1::HOST, absl::Seconds(1));
  for (int i = 0; i < 8; ++i) {  // 1.6 s of renewing every 0.2 s keeps it alive.
    absl::SleepFor(absl::Milliseconds(200));
    ASSERT_TRUE(d.client->RenewLease(kept).ok());
  }
  EXPECT_EQ(d.client->GetBuffer(doomed).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(d.client->GetBuffer(kept).ok());
}

TEST(Integration, BufferInUseOutlivesItsLease) {
  // Few bytes at a low rate: the write before the move must fit in the one-second lease
  // under ASan on a busy two-core machine too (48 MiB did not).
  Daemon d({"--max_move_rate=4MiB"});
  std::string a = d.Alloc(12 << 20, v1::HOST, absl::Seconds(1));
  std::string b = d.Alloc(12 << 20);
  ASSERT_TRUE(d.client->Write(Ref(a), std::string(12 << 20, 'q')).ok());
  // A fresh second of lease, then a move of about three seconds: the lease runs out
  // while the move still reads the buffer.
  ASSERT_TRUE(d.client->RenewLease(a).ok());
  MoveOptions o;
  o.checksum = true;
  auto t = d.client->Move(Ref(a), Ref(b), o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->state(), v1::SUCCEEDED) << t->error_message();
  EXPECT_EQ(d.client->GetBuffer(a).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(d.client->Read(Ref(b, 0, 4)).value(), "qqqq");
  // Its memory went back to the pool.
  auto info = d.client->GetInfo();
  EXPECT_EQ(info->pools(0).free(), info->pools(0).capacity() - (12u << 20));
}

TEST(Integration, ReleaseOfABufferInUseIsRefused) {
  Daemon d({"--max_move_rate=64MiB"});
  std::string a = d.Alloc(32 << 20), b = d.Alloc(32 << 20);
  MoveOptions o;
  o.wait = false;
  auto t = d.client->Move(Ref(a), Ref(b), o);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(d.client->Release(b).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.client->Wait(t->id())->state(), v1::SUCCEEDED);
  EXPECT_TRUE(d.client->Release(b).ok());
}

TEST(Integration, SigtermLetsRunningMovesFinishThenExits) {
  Daemon d({"--max_move_rate=64MiB"});
  std::string a = d.Alloc(48 << 20), b = d.Alloc(48 << 20), c = d.Alloc(4096);
  ASSERT_TRUE(d.client->Write(Ref(a), std::string(48 << 20, 'z')).ok());
  MoveOptions o;
  o.wait = false;
  auto t = d.client->Move(Ref(a), Ref(b), o);
  ASSERT_TRUE(t.ok());
  v1::Transfer last;
  absl::Notification watched;
  std::thread watcher([&] {
    auto end = d.client->Watch(t->id(), nullptr);
    if (end.ok()) last = *end;
    watched.Notify();
  });
  absl::SleepFor(absl::Milliseconds(100));
  d.process->Signal(SIGTERM);
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(d.client->Move(Ref(a, 0, 4096), Ref(c), o).status().code(), StatusCode::kUnavailable);
  watcher.join();
  EXPECT_EQ(last.state(), v1::SUCCEEDED);
  auto code = d.process->WaitExit(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << d.process->Log();
  EXPECT_EQ(*code, 0) << d.process->Log();
}

TEST(Integration, SigtermCancelsWhatOutlastsTheGrace) {
  Daemon d({"--max_move_rate=16MiB", "--drain_grace=300ms"});
  std::string a = d.Alloc(64 << 20), b = d.Alloc(64 << 20);
  MoveOptions o;
  o.wait = false;
  auto t = d.client->Move(Ref(a), Ref(b), o);
  ASSERT_TRUE(t.ok());
  v1::Transfer last;
  std::thread watcher([&] {
    auto end = d.client->Watch(t->id(), nullptr);
    if (end.ok()) last = *end;
  });
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time start = absl::Now();
  d.process->Signal(SIGTERM);
  auto code = d.process->WaitExit(absl::Seconds(10));
  watcher.join();
  ASSERT_TRUE(code.ok()) << d.process->Log();
  EXPECT_EQ(*code, 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));  // Not the 4 s the move needed.
  EXPECT_EQ(last.state(), v1::CANCELLED);
}

TEST(Integration, ServesOnAUnixSocket) {
  // Socket paths are limited to 107 bytes, shorter than Bazel's TEST_TMPDIR allows.
  const std::string sock = absl::StrCat("/tmp/gpumoved-test-", getpid(), ".sock");
  Daemon d({"--listen=unix:" + sock});
  EXPECT_EQ(d.process->address(), "unix:" + sock);
  std::string a = d.Alloc(1 << 20), b = d.Alloc(1 << 20);
  ASSERT_TRUE(d.client->Write(Ref(a), RandomBytes(1 << 20, 5)).ok());
  EXPECT_EQ(d.client->Move(Ref(a), Ref(b))->state(), v1::SUCCEEDED);
  EXPECT_EQ(d.Contents(b), RandomBytes(1 << 20, 5));
}

// Flag values that cannot work stop the daemon at start with a message saying which.
TEST(Integration, BadFlagValuesStopTheStartAndSaySo) {
  for (const auto& [flag, said] : std::vector<std::pair<std::string, std::string>>{
           {"--cuda_ipc_fence_quiet=1MiB", "--cuda_ipc_fence_quiet is bytes per second"},
           {"--mpi_spin=maybe", "--mpi_spin must be auto, on or off"},
           {"--mpi=sometimes", "--mpi must be auto, on or off"},
           {"--gpus=GPU-00000000-nope", "--gpus: no GPU"}}) {
    auto d = DaemonProcess::Start({flag});
    ASSERT_FALSE(d.ok()) << flag;
    EXPECT_NE(d.status().message().find(said), std::string::npos) << d.status();
  }
}

// Tenants' weights (issue 56): a file with a bad line stops the start naming it; a good one
// is taken, and moves carry their classes.
TEST(Integration, TenantWeightsFileIsCheckedAndMovesKeepTheirClasses) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string file = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/weights.", getpid());
  std::ofstream(file) << "anonymous 3\nteam-b 0\n";
  auto refused = DaemonProcess::Start({"--tenant_weights=" + file});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("line 2: weight \"0\""), std::string::npos)
      << refused.status();
  std::ofstream(file) << "anonymous 3\n* 1\n";
  Daemon d({"--tenant_weights=" + file, "--qos_starvation_bound=100ms"});
  std::string a = d.Alloc(1 << 20), b = d.Alloc(1 << 20);
  MoveOptions o;
  o.priority = v1::LATENCY;
  auto moved = d.client->Move(Ref(a), Ref(b), o);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->state(), v1::SUCCEEDED);
  EXPECT_EQ(moved->priority(), v1::LATENCY);
  o.priority = static_cast<v1::Priority>(9);
  EXPECT_EQ(d.client->Move(Ref(a), Ref(b), o).status().code(), StatusCode::kInvalidArgument);
  std::filesystem::remove(file);
}

TEST(Integration, NodeInfoSaysHostPoolsOnlyWithoutAGpu) {
  Daemon d({"--node=node-x", "--gpus=none"});
  auto info = d.client->GetInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->node(), "node-x");
  EXPECT_EQ(info->gpus_size(), 0);
  EXPECT_NE(info->gpu_status().find("host pools only"), std::string::npos) << info->gpu_status();
  ASSERT_EQ(info->pools_size(), 2);
  EXPECT_EQ(info->pools(0).kind(), v1::HOST);
  EXPECT_EQ(info->pools(1).kind(), v1::PINNED_HOST);
  EXPECT_EQ(info->listen(0), d.process->address());
  EXPECT_EQ(info->workers(), 4u);  // --copy_threads' default.
  std::map<v1::Path, const v1::PathInfo*> paths;
  for (const auto& p : info->paths()) paths[p.path()] = &p;
  ASSERT_TRUE(paths.count(v1::PATH_AUTO) && paths.count(v1::LOCAL) && paths.count(v1::MPI));
  EXPECT_TRUE(paths[v1::LOCAL]->available());
  EXPECT_NE(paths[v1::PATH_AUTO]->reason().find("preferring"), std::string::npos);
  // A daemon not started by an MPI launcher has no MPI path, and says so.
  EXPECT_FALSE(paths[v1::MPI]->available());
  EXPECT_NE(paths[v1::MPI]->reason().find("not an MPI rank"), std::string::npos)
      << paths[v1::MPI]->reason();
}

TEST(Integration, MetricsCountTransfersAndPools) {
  Daemon d({"--metrics_listen=0", "--max_move_rate=32MiB"});  // A port alone: loopback.
  auto info = d.client->GetInfo();
  ASSERT_FALSE(info->metrics_address().empty());
  EXPECT_TRUE(absl::StartsWith(info->metrics_address(), "127.0.0.1:")) << info->metrics_address();
  std::string a = d.Alloc(1 << 20), b = d.Alloc(1 << 20), big = d.Alloc(64 << 20),
              big2 = d.Alloc(64 << 20);
  ASSERT_EQ(d.client->Move(Ref(a), Ref(b))->state(), v1::SUCCEEDED);
  ASSERT_EQ(d.client->Move(Ref(a), Ref(b))->state(), v1::SUCCEEDED);
  MoveOptions o;
  o.wait = false;
  auto slow = d.client->Move(Ref(big), Ref(big2), o);
  ASSERT_TRUE(d.client->Cancel(slow->id()).ok());
  ASSERT_EQ(d.client->Wait(slow->id())->state(), v1::CANCELLED);
  const std::string m = FetchMetrics(info->metrics_address());
  EXPECT_NE(m.find("gpumoved_transfers_total{outcome=\"SUCCEEDED\",path=\"LOCAL\"} 2"),
            std::string::npos) << m;
  EXPECT_NE(m.find("gpumoved_transfers_total{outcome=\"CANCELLED\",path=\"LOCAL\"} 1"),
            std::string::npos) << m;
  EXPECT_NE(m.find("gpumoved_transfer_bytes_total{path=\"LOCAL\"} 2097152"), std::string::npos)
      << m;
  EXPECT_NE(m.find("gpumoved_transfer_seconds_count{path=\"LOCAL\"} 2"), std::string::npos) << m;
  // By tenant and class (an open daemon's callers are tenant anonymous; unset is normal),
  // and the time moves waited to start.
  EXPECT_NE(m.find("gpumoved_tenant_bytes_total{class=\"normal\",tenant=\"anonymous\"} 2097152"),
            std::string::npos) << m;
  EXPECT_NE(m.find("gpumoved_queue_wait_seconds_count{class=\"normal\"}"), std::string::npos)
      << m;
  // Submit-to-end latency by path and size class (1 MiB: le_1MiB), for dashboards.
  EXPECT_NE(m.find("gpumoved_transfer_latency_seconds_count{path=\"LOCAL\",size=\"le_1MiB\"} 2"),
            std::string::npos) << m;
  // A gauge, read once a second: it may still show the cancelled move for a moment.
  std::string active = m;
  for (int i = 0; i < 40 && active.find("gpumoved_transfers_active 0") == std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    active = FetchMetrics(info->metrics_address());
  }
  EXPECT_NE(active.find("gpumoved_transfers_active 0"), std::string::npos) << active;
  // Prepared piece lists kept (the gauges are read once a second).
  v1::Segment g;
  g.set_length(4096);
  EXPECT_FALSE(d.client->PreparePieces({g, g}, {}).ok());  // Overlapping: refused.
  g.set_destination_offset(8192);
  v1::Segment h;
  h.set_length(4096);
  ASSERT_TRUE(d.client->PreparePieces({g, h}, {}).ok());
  std::string kept;
  for (int i = 0; i < 50 && kept.find("gpumoved_prepared_pieces 2") == std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    kept = FetchMetrics(info->metrics_address());
  }
  EXPECT_NE(kept.find("gpumoved_prepared_piece_lists 1"), std::string::npos) << kept;
  EXPECT_NE(kept.find("gpumoved_prepared_pieces 2"), std::string::npos) << kept;
  EXPECT_NE(m.find("gpumoved_pool_bytes{device=\"\",kind=\"HOST\",state=\"capacity\"} 536870912"),
            std::string::npos) << m;
}

// The TCP sockets process `pid` listens on: "address:port" in /proc/net/tcp's hex form
// (0100007F:1D2E is 127.0.0.1:7470), IPv6 ones prefixed "6/".
std::vector<std::string> ListeningSockets(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fds = absl::StrCat("/proc/", pid, "/fd");
  for (const auto& entry : std::filesystem::directory_iterator(fds)) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (!ec && absl::StartsWith(target, "socket:[")) {
      inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::istringstream in(ReadFile(table));
    std::string line;
    std::getline(in, line);  // Header.
    while (std::getline(in, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
      if (f.size() > 9 && f[3] == "0A" && inodes.count(f[9]) > 0) {
        out.push_back(absl::StrCat(table[13] == '6' ? "6/" : "", f[1]));
      }
    }
  }
  return out;
}

// A daemon that serves gRPC on loopback has UCX listen there too (it once listened on
// every interface while gRPC stayed on 127.0.0.1).
TEST(Integration, UcxListensOnlyWhereGrpcDoesByDefault) {
  Daemon d;
  const std::vector<std::string> sockets = ListeningSockets(d.process->pid());
  EXPECT_GE(sockets.size(), 2u) << "gRPC's and UCX's listeners";
  for (const std::string& s : sockets) {
    const bool loopback = absl::StartsWith(s, "0100007F:") ||
                          absl::StartsWith(s, "6/00000000000000000000000001000000:") ||
                          absl::StartsWith(s, "6/0000000000000000FFFF00000100007F:");
    EXPECT_TRUE(loopback) << s << " is not a loopback address";
  }
}

// An open daemon serves channelz (and reflection) as before: its callers may do anything.
TEST(Integration, AnOpenDaemonServesChannelz) {
  Daemon d;
  grpc::GenericStub stub(d.client->channel());
  grpc::ClientContext context;
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1), response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, "/grpc.channelz.v1.Channelz/GetTopChannels", grpc::StubOptions(),
                 &request, &response, [&](grpc::Status s) {
                   status = s;
                   done.Notify();
                 });
  done.WaitForNotification();
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST(Integration, HealthServiceReportsServing) {
  Daemon d;
  grpc::GenericStub stub(d.client->channel());
  grpc::ClientContext context;
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1), response;  // An empty HealthCheckRequest: the server.
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                 &response, [&](grpc::Status s) {
                   status = s;
                   done.Notify();
                 });
  done.WaitForNotification();
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));  // status: SERVING
}

}  // namespace
}  // namespace gpumove
