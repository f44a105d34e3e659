// Open streams and blocked waits hold no daemon thread each (issue 48): hundreds of
// Notifications and Watch streams, and hundreds of Waits, against a real gpumoved leave
// its thread count within a small bound of its idle count, and every one of them still
// delivers its events and its end.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/gpumove_client.h"
#include "gtest/gtest.h"
#include "proto/gpumove/v1/gpumove.grpc.pb.h"
#include "tests/util/daemon_process.h"
#include "tests/util/test_node.h"

namespace gpumove {
namespace {

constexpr int kStreams = 200;
// Threads the daemon may add for all of them together (the sync server held one each).
constexpr int kBound = 100;

int Threads(pid_t pid) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"))) {
    (void)e;
    ++n;
  }
  return n;
}

class StreamThreads : public ::testing::Test {
 protected:
  void SetUp() override {
    // A move of 64 MiB at 4 MiB/s lasts 16 s: it runs while the streams open, and ends
    // when the test cancels it.
    auto p = DaemonProcess::Start(
        {"--max_move_rate=4MiB", "--host_pool_size=256MiB", "--pinned_pool_size=16MiB"});
    ASSERT_TRUE(p.ok()) << p.status();
    process_ = *std::move(p);
    auto c = Client::Connect(process_->address());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
    channel_ = grpc::CreateChannel(process_->address(), grpc::InsecureChannelCredentials());
    transfers_ = v1::TransferService::NewStub(channel_);
    auto a = client_->Allocate(64 << 20), b = client_->Allocate(64 << 20);
    ASSERT_TRUE(a.ok() && b.ok());
    MoveOptions o;
    o.wait = false;
    auto t = client_->Move(Ref(a->id()), Ref(b->id()), o);
    ASSERT_TRUE(t.ok()) << t.status();
    slow_ = t->id();
    absl::SleepFor(absl::Milliseconds(300));  // The move's threads are up.
    idle_ = Threads(process_->pid());
  }

  // The daemon's threads, after a moment for any it would start.
  int Busy() {
    absl::SleepFor(absl::Milliseconds(500));
    return Threads(process_->pid());
  }

  std::unique_ptr<DaemonProcess> process_;
  std::unique_ptr<Client> client_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::TransferService::Stub> transfers_;
  std::string slow_;
  int idle_ = 0;
};

TEST_F(StreamThreads, HundredsOfNotificationsAndWatchStreamsHoldNoThreadEach) {
  std::vector<std::unique_ptr<NotificationStream>> subscribers;
  for (int i = 0; i < kStreams; ++i) {
    auto s = client_->Subscribe(v1::NotificationsRequest(), absl::Seconds(30));
    ASSERT_TRUE(s.ok()) << i << ": " << s.status();
    subscribers.push_back(*std::move(s));
  }
  struct Watcher {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::TransferEvent>> reader;
  };
  std::vector<std::unique_ptr<Watcher>> watchers;
  for (int i = 0; i < kStreams; ++i) {
    auto w = std::make_unique<Watcher>();
    w->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    v1::WatchRequest request;
    request.set_id(slow_);
    request.mutable_progress_interval()->set_seconds(1);
    w->reader = transfers_->Watch(&w->context, request);
    v1::TransferEvent first;
    ASSERT_TRUE(w->reader->Read(&first)) << i;
    EXPECT_EQ(first.transfer().state(), v1::RUNNING);
    watchers.push_back(std::move(w));
  }
  const int busy = Busy();
  std::cout << "daemon threads: " << idle_ << " idle, " << busy << " with " << 2 * kStreams
            << " streams open\n";
  EXPECT_LT(busy, idle_ + kBound) << "threads: " << idle_ << " idle, " << busy << " with "
                                  << kStreams << " Notifications and " << kStreams
                                  << " Watch streams open";

  // Every subscriber hears of a move with notify bytes.
  auto c = client_->Allocate(4096), d = client_->Allocate(4096);
  ASSERT_TRUE(c.ok() && d.ok());
  MoveOptions noted;
  noted.notify = "to every subscriber";
  auto moved = client_->Move(Ref(c->id()), Ref(d->id()), noted);
  ASSERT_TRUE(moved.ok()) << moved.status();
  for (auto& s : subscribers) {
    v1::Notification n;
    ASSERT_TRUE(s->Next(&n));
    EXPECT_EQ(n.transfer_id(), moved->id());
    EXPECT_EQ(n.notify(), "to every subscriber");
  }
  // Every watcher sees the move's end, and its stream ends OK.
  ASSERT_TRUE(client_->Cancel(slow_).ok());
  for (auto& w : watchers) {
    v1::TransferEvent e, last;
    while (w->reader->Read(&e)) last = e;
    EXPECT_EQ(last.transfer().state(), v1::CANCELLED);
    grpc::Status st = w->reader->Finish();
    EXPECT_TRUE(st.ok()) << st.error_message();
  }
  for (auto& s : subscribers) {
    s->Cancel();
    EXPECT_EQ(s->Finish().code(), absl::StatusCode::kCancelled);
  }
}

// Blocked Waits, made without a thread each on the client side too (gRPC's callback
// client), hold no daemon thread each; Submits with wait, on the synchronous server (their
// callback form was slower for small moves), hold one each: 150 Waits and 50 Submits stay
// under idle + 100. All of them end when the move they wait for does.
TEST_F(StreamThreads, HundredsOfBlockedWaitsHoldNoThreadEach) {
  constexpr int kWaits = 150, kSubmits = 50;
  struct Call {
    grpc::ClientContext context;
    v1::WaitRequest wait;
    v1::SubmitRequest submit;
    v1::Transfer transfer;
    v1::SubmitResponse submitted;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Call>> calls;
  absl::Mutex mu;
  int ended = 0;
  auto done = [&](Call* c) {
    return [&, c](grpc::Status st) {
      absl::MutexLock lock(&mu);
      c->status = std::move(st);
      ++ended;
    };
  };
  auto t = client_->GetTransfer(slow_);
  ASSERT_TRUE(t.ok()) << t.status();
  for (int i = 0; i < kWaits; ++i) {
    auto c = std::make_unique<Call>();
    c->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    c->wait.set_id(slow_);
    transfers_->async()->Wait(&c->context, &c->wait, &c->transfer, done(c.get()));
    calls.push_back(std::move(c));
  }
  // Moves into the slow move's destination wait for it (the same bytes, in order).
  for (int i = 0; i < kSubmits; ++i) {
    auto c = std::make_unique<Call>();
    c->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    v1::TransferSpec* spec = c->submit.add_transfers();
    *spec->mutable_source() = t->source();
    spec->mutable_source()->set_length(4096);
    *spec->mutable_destination() = t->destination();
    spec->mutable_destination()->set_length(4096);
    c->submit.set_wait(true);
    transfers_->async()->Submit(&c->context, &c->submit, &c->submitted, done(c.get()));
    calls.push_back(std::move(c));
  }
  const int busy = Busy();
  std::cout << "daemon threads: " << idle_ << " idle, " << busy << " with " << kWaits
            << " Waits and " << kSubmits << " Submits with wait open\n";
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(ended, 0) << "a wait ended before the move it waits for";
  }
  EXPECT_LT(busy, idle_ + kBound) << "threads: " << idle_ << " idle, " << busy << " with "
                                  << kWaits + kSubmits << " waits open";

  auto cancelled = client_->Cancel(slow_, /*wait=*/true);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  {
    absl::MutexLock lock(&mu);
    auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return ended == kWaits + kSubmits; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(60)))
        << ended << " of " << kWaits + kSubmits << " ended";
  }
  for (int i = 0; i < kWaits; ++i) {
    EXPECT_TRUE(calls[i]->status.ok()) << i << ": " << calls[i]->status.error_message();
    EXPECT_EQ(calls[i]->transfer.state(), v1::CANCELLED) << i;
  }
  for (int i = kWaits; i < kWaits + kSubmits; ++i) {
    EXPECT_TRUE(calls[i]->status.ok()) << i << ": " << calls[i]->status.error_message();
    ASSERT_EQ(calls[i]->submitted.transfers_size(), 1) << i;
    EXPECT_EQ(calls[i]->submitted.transfers(0).state(), v1::SUCCEEDED) << i;
  }
}

// Streams and waits a node relays to the node they belong to hold no thread of the
// relaying node each either (it reads the other node's stream with the callback client).
TEST(RelayedStreamThreads, HundredsOfRelayedStreamsAndWaitsHoldNoThreadEach) {
  constexpr int kEach = 100;
  const std::vector<std::string> flags = {"--max_move_rate=4MiB", "--host_pool_size=256MiB",
                                          "--pinned_pool_size=16MiB"};
  TestNode a = LaunchNode("a", "", flags);
  ASSERT_TRUE(a.client);
  TestNode b = LaunchNode("b", a.process->address(), flags);
  ASSERT_TRUE(b.client);
  for (TestNode* n : {&a, &b}) ASSERT_TRUE(AwaitPeersUp(*n, 1).ok()) << n->name;
  auto src = b.client->Allocate(64 << 20), dst = b.client->Allocate(64 << 20);
  ASSERT_TRUE(src.ok() && dst.ok());
  MoveOptions o;
  o.wait = false;
  auto slow = b.client->Move(Ref(src->id()), Ref(dst->id()), o);
  ASSERT_TRUE(slow.ok()) << slow.status();
  absl::SleepFor(absl::Milliseconds(300));
  const int idle = Threads(a.process->pid());

  // Through a: Notifications of b, Watch and Wait of b's move.
  std::vector<std::unique_ptr<NotificationStream>> subscribers;
  for (int i = 0; i < kEach; ++i) {
    v1::NotificationsRequest request;
    request.set_node("b");
    auto s = a.client->Subscribe(request, absl::Seconds(30));
    ASSERT_TRUE(s.ok()) << i << ": " << s.status();
    subscribers.push_back(*std::move(s));
  }
  auto stub = v1::TransferService::NewStub(
      grpc::CreateChannel(a.process->address(), grpc::InsecureChannelCredentials()));
  struct Watcher {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::TransferEvent>> reader;
  };
  std::vector<std::unique_ptr<Watcher>> watchers;
  for (int i = 0; i < kEach; ++i) {
    auto w = std::make_unique<Watcher>();
    v1::WatchRequest request;
    request.set_id(slow->id());
    w->reader = stub->Watch(&w->context, request);
    v1::TransferEvent first;
    ASSERT_TRUE(w->reader->Read(&first))
        << i << ": " << w->reader->Finish().error_message() << "\nb's log:\n"
        << a.process->Log().substr(std::max<size_t>(a.process->Log().size(), 4000) - 4000);
    watchers.push_back(std::move(w));
  }
  struct Waiter {
    grpc::ClientContext context;
    v1::WaitRequest request;
    v1::Transfer out;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Waiter>> waiters;
  absl::Mutex mu;
  int ended = 0;
  for (int i = 0; i < kEach; ++i) {
    auto w = std::make_unique<Waiter>();
    w->request.set_id(slow->id());
    stub->async()->Wait(&w->context, &w->request, &w->out, [&, w = w.get()](grpc::Status st) {
      absl::MutexLock lock(&mu);
      w->status = std::move(st);
      ++ended;
    });
    waiters.push_back(std::move(w));
  }
  absl::SleepFor(absl::Milliseconds(500));
  const int busy = Threads(a.process->pid());
  std::cout << "relaying node's threads: " << idle << " idle, " << busy << " with " << 3 * kEach
            << " relayed streams and waits open\n";
  EXPECT_LT(busy, idle + kBound);

  auto c = b.client->Allocate(4096), d = b.client->Allocate(4096);
  ASSERT_TRUE(c.ok() && d.ok());
  MoveOptions noted;
  noted.notify = "relayed";
  auto moved = b.client->Move(Ref(c->id()), Ref(d->id()), noted);
  ASSERT_TRUE(moved.ok()) << moved.status();
  for (auto& s : subscribers) {
    v1::Notification n;
    ASSERT_TRUE(s->Next(&n));
    EXPECT_EQ(n.notify(), "relayed");
  }
  ASSERT_TRUE(b.client->Cancel(slow->id()).ok());
  for (auto& w : watchers) {
    v1::TransferEvent e, last;
    while (w->reader->Read(&e)) last = e;
    EXPECT_EQ(last.transfer().state(), v1::CANCELLED);
    EXPECT_TRUE(w->reader->Finish().ok());
  }
  {
    absl::MutexLock lock(&mu);
    auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return ended == kEach; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(60))) << ended;
  }
  for (auto& w : waiters) {
    EXPECT_TRUE(w->status.ok()) << w->status.error_message();
    EXPECT_EQ(w->out.state(), v1::CANCELLED);
  }
  for (auto& s : subscribers) s->Cancel();
}

}  // namespace
}  // namespace gpumove
