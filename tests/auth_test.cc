// Bearer tokens, tenants and roles: every public RPC called with no credentials, a bad
// token, another tenant's token, its own tenant's, a reader's and an admin's, with the
// code each must get and the data unchanged where refused; the same through a
// forwarding node; the token file re-read on change.
#include "daemon/server/auth.h"

#include <grp.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/gpumove_client.h"
#include "gtest/gtest.h"
#include "tests/util/daemon_process.h"

namespace gpumove {
namespace {

using absl::StatusCode;

constexpr char kTokens[] = R"(# token,principal,tenant,role
alice-token-0123456789,alice,team-a,user
rita-token-0123456789,rita,team-a,reader
bob-token-0123456789,bob,team-b,user
root-token-0123456789,root,ops,admin
)";

// A unary call of `method` with an empty request and no credentials; its status.
grpc::Status EmptyCall(const std::string& address, const std::string& method) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1), response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    status = s;
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

constexpr char kChannelz[] = "/grpc.channelz.v1.Channelz/GetTopChannels";
constexpr char kHealth[] = "/grpc.health.v1.Health/Check";

// A reflection list_services request (`version` v1 or v1alpha) with `token` if any: its
// status, and the services listed.
grpc::Status ListServices(const std::string& address, const std::string& version,
                          const std::string& token, std::string* services) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  grpc::Slice ask(std::string("\x3a\x00", 2));  // ServerReflectionRequest{list_services: ""}.
  grpc::ByteBuffer request(&ask, 1), response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context,
                 absl::StrCat("/grpc.reflection.", version, ".ServerReflection/ServerReflectionInfo"),
                 grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
                   status = s;
                   done.Notify();
                 });
  done.WaitForNotification();
  std::vector<grpc::Slice> slices;
  services->clear();
  if (status.ok() && response.Dump(&slices).ok()) {
    for (auto& s : slices) services->append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return status;
}

TEST(TokenFile, ParsesAndRefusesWhatDoesNotFit) {
  auto tokens = ParseTokenFile(kTokens);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 4u);
  EXPECT_EQ(tokens->at("rita-token-0123456789").role, Role::kReader);
  EXPECT_EQ(tokens->at("root-token-0123456789").owner(), "*");
  EXPECT_EQ(tokens->at("alice-token-0123456789").owner(), "team-a");
  for (const char* bad : {"t,p,tenant\n", "t,p,tenant,superuser\n", "t,p,tenant,user\nt,q,x,user\n",
                          ",p,tenant,user\n", "t,p,*,user\n", "t,p,tenant,user,extra\n"}) {
    auto r = ParseTokenFile(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(r.status().message(), "line ")) << r.status();
  }
}

// Whether `client` sees its one peer up (waits up to 20 s).
bool OnePeerUp(Client& client) {
  for (absl::Time end = absl::Now() + absl::Seconds(20); absl::Now() < end;) {
    auto peers = client.ListPeers();
    if (peers.ok() && peers->size() == 1 && (*peers)[0].up()) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return false;
}

// An open stream that `revoke` takes the credentials of ends UNAUTHENTICATED ("revoked")
// within 5 s, and not before.
void EndsUnauthenticatedWhenRevoked(NotificationStream& stream, absl::FunctionRef<void()> revoke) {
  absl::Notification ended;
  absl::Time end_time;
  std::thread reader([&] {
    v1::Notification n;
    while (stream.Next(&n)) {
    }
    end_time = absl::Now();
    ended.Notify();
  });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(ended.HasBeenNotified()) << "the stream ended before the token was removed";
  const absl::Time revoked = absl::Now();
  revoke();
  const bool done = ended.WaitForNotificationWithTimeout(absl::Seconds(10));
  if (!done) stream.Cancel();
  reader.join();
  ASSERT_TRUE(done) << "the stream outlived its token by 10 s";
  EXPECT_LT(end_time - revoked, absl::Seconds(5));
  absl::Status st = stream.Finish();
  EXPECT_EQ(st.code(), StatusCode::kUnauthenticated) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "revoked")) << st;
}

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/auth_test.", getpid());
    std::filesystem::create_directories(dir_);
    tokens_ = dir_ + "/tokens.csv";
    WriteTokens(kTokens);
    secret_ = dir_ + "/secret";
    std::ofstream(secret_) << "auth-test-cluster-secret-0123456789\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void WriteTokens(const std::string& text) {
    const std::string tmp = tokens_ + ".new";
    std::ofstream(tmp) << text;
    std::filesystem::rename(tmp, tokens_);
  }
  std::unique_ptr<Client> As(const DaemonProcess& d, const std::string& token) {
    ConnectOptions o;
    o.token = token;
    auto c = Client::Connect(d.address(), o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  std::string dir_, tokens_, secret_;
};

// What one caller gets for each RPC against team-a's buffer and transfer.
struct Expect {
  const char* who;
  std::string token;
  StatusCode see;     // Get, Read, Wait, Watch, GetTransfer of team-a's objects.
  StatusCode change;  // Write, Release, RenewLease, Submit, Cancel on them.
  StatusCode make;    // Allocate (of its own).
  StatusCode info;    // GetInfo, ListPeers.
};

TEST_F(AuthTest, EveryRpcForEveryKindOfCaller) {
  auto d = DaemonProcess::Start({"--node=a", "--auth_tokens=" + tokens_});
  ASSERT_TRUE(d.ok()) << d.status();
  auto alice = As(**d, "alice-token-0123456789");
  ASSERT_NE(alice, nullptr);
  const std::string bytes(8192, 'a');
  auto buf = alice->Allocate(8192);
  auto dst = alice->Allocate(8192);
  ASSERT_TRUE(buf.ok() && dst.ok()) << buf.status();
  ASSERT_TRUE(alice->Write(Ref(buf->id()), bytes).ok());
  auto moved = alice->Move(Ref(buf->id()), Ref(dst->id()));
  ASSERT_TRUE(moved.ok()) << moved.status();

  const std::vector<Expect> cases = {
      {"no credentials", "", StatusCode::kUnauthenticated, StatusCode::kUnauthenticated,
       StatusCode::kUnauthenticated, StatusCode::kUnauthenticated},
      {"a bad token", "not-a-token", StatusCode::kUnauthenticated, StatusCode::kUnauthenticated,
       StatusCode::kUnauthenticated, StatusCode::kUnauthenticated},
      {"another tenant", "bob-token-0123456789", StatusCode::kNotFound, StatusCode::kNotFound,
       StatusCode::kOk, StatusCode::kOk},
      {"a reader of the tenant", "rita-token-0123456789", StatusCode::kOk,
       StatusCode::kPermissionDenied, StatusCode::kPermissionDenied, StatusCode::kOk},
      {"an admin", "root-token-0123456789", StatusCode::kOk, StatusCode::kOk, StatusCode::kOk,
       StatusCode::kOk},
  };
  for (const Expect& e : cases) {
    SCOPED_TRACE(e.who);
    auto c = As(**d, e.token);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->GetInfo().status().code(), e.info);
    EXPECT_EQ(c->ListPeers().status().code(), e.info);
    EXPECT_EQ(c->GetBuffer(buf->id()).status().code(), e.see);
    EXPECT_EQ(c->Read(Ref(buf->id())).status().code(), e.see);
    EXPECT_EQ(c->GetTransfer(moved->id()).status().code(), e.see);
    EXPECT_EQ(c->Wait(moved->id(), absl::Seconds(1)).status().code(), e.see);
    EXPECT_EQ(c->Watch(moved->id(), [](const v1::Transfer&) {}).status().code(), e.see);
    auto listed = c->ListBuffers();
    EXPECT_EQ(listed.status().code(), e.info == StatusCode::kOk ? StatusCode::kOk : e.info);
    if (listed.ok()) {
      bool sees = false;
      for (const auto& b : *listed) sees |= b.id() == buf->id();
      EXPECT_EQ(sees, e.see == StatusCode::kOk) << "ListBuffers";
    }
    auto transfers = c->ListTransfers();
    if (transfers.ok()) {
      bool sees = false;
      for (const auto& t : *transfers) sees |= t.id() == moved->id();
      EXPECT_EQ(sees, e.see == StatusCode::kOk) << "ListTransfers";
    }
    // Changes that would alter team-a's bytes or buffers (an admin's Write is last, below).
    if (e.change != StatusCode::kOk) {
      EXPECT_EQ(c->Write(Ref(buf->id()), std::string(8192, 'x')).status().code(), e.change);
      EXPECT_EQ(c->Move(Ref(dst->id()), Ref(buf->id())).status().code(), e.change);
      EXPECT_EQ(c->Release(buf->id()).code(), e.change);
      EXPECT_EQ(c->RenewLease(buf->id(), absl::Seconds(60)).status().code(), e.change);
      EXPECT_EQ(c->Cancel(moved->id()).status().code(), e.change);
      EXPECT_EQ(c->Export(buf->id()).status().code(), e.change);
      // Unchanged.
      auto back = alice->Read(Ref(buf->id()));
      ASSERT_TRUE(back.ok());
      EXPECT_EQ(*back, bytes);
      EXPECT_TRUE(alice->GetBuffer(buf->id()).ok());
    }
    auto own = c->Allocate(4096);
    EXPECT_EQ(own.status().code(), e.make);
    if (own.ok()) {
      // Its own buffer: alice (team-a) does not see another tenant's, an admin's is the
      // admins'.
      EXPECT_EQ(alice->GetBuffer(own->id()).status().code(), StatusCode::kNotFound);
      EXPECT_TRUE(c->Release(own->id()).ok());
    }
  }
  // An admin changes team-a's things.
  auto root = As(**d, "root-token-0123456789");
  ASSERT_TRUE(root->Write(Ref(buf->id()), std::string(8192, 'r')).ok());
  EXPECT_EQ(*alice->Read(Ref(buf->id())), std::string(8192, 'r'));
  EXPECT_TRUE(root->Release(buf->id()).ok());
  EXPECT_EQ(alice->GetBuffer(buf->id()).status().code(), StatusCode::kNotFound);
  // Refusals and admin actions are audited.
  const std::string log = (*d)->Log();
  EXPECT_TRUE(absl::StrContains(log, "audit {\"method\":\"Write\",\"principal\":\"rita\"")) << log;
  EXPECT_TRUE(absl::StrContains(log, "\"outcome\":\"admin\"")) << log;
}

// Prepared piece lists belong to a tenant: another tenant can neither name, list nor
// release them (NOT_FOUND, as if they did not exist), a reader lists but neither prepares
// nor releases, an admin sees and uses every tenant's.
TEST_F(AuthTest, PreparedPieceListsBelongToTheirTenant) {
  auto d = DaemonProcess::Start({"--node=a", "--auth_tokens=" + tokens_});
  ASSERT_TRUE(d.ok()) << d.status();
  auto alice = As(**d, "alice-token-0123456789");
  auto bob = As(**d, "bob-token-0123456789");
  auto rita = As(**d, "rita-token-0123456789");
  auto root = As(**d, "root-token-0123456789");
  auto nobody = As(**d, "");
  ASSERT_TRUE(alice && bob && rita && root && nobody);
  v1::Segment g;
  g.set_source_offset(0);
  g.set_destination_offset(100);
  g.set_length(50);
  auto list = alice->PreparePieces({g}, {});
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->owner(), "team-a");
  EXPECT_EQ(nobody->PreparePieces({g}, {}).status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(nobody->ListPreparedPieces().status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(rita->PreparePieces({g}, {}).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(rita->ReleasePieces(list->id()).code(), StatusCode::kPermissionDenied);
  auto seen = [](Client& c) {
    auto l = c.ListPreparedPieces();
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? l->size() : 0;
  };
  EXPECT_EQ(seen(*rita), 1u);
  EXPECT_EQ(seen(*root), 1u);
  EXPECT_EQ(seen(*bob), 0u);
  EXPECT_EQ(bob->ReleasePieces(list->id()).code(), StatusCode::kNotFound);
  // Bob names alice's list for a move of his own buffers: NOT_FOUND, nothing written.
  auto bs = bob->Allocate(4096);
  auto bd = bob->Allocate(4096);
  ASSERT_TRUE(bs.ok() && bd.ok());
  ASSERT_TRUE(bob->Write(Ref(bs->id()), std::string(4096, 's')).ok());
  ASSERT_TRUE(bob->Write(Ref(bd->id()), std::string(4096, 'd')).ok());
  MoveOptions o;
  o.prepared_pieces = list->id();
  EXPECT_EQ(bob->Move(Ref(bs->id()), Ref(bd->id()), o).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(*bob->Read(Ref(bd->id())), std::string(4096, 'd'));
  // Alice's own move with it, and an admin's.
  auto as = alice->Allocate(4096);
  auto ad = alice->Allocate(4096);
  ASSERT_TRUE(as.ok() && ad.ok());
  ASSERT_TRUE(alice->Write(Ref(as->id()), std::string(4096, 'a')).ok());
  auto t = alice->Move(Ref(as->id()), Ref(ad->id()), o);
  ASSERT_TRUE(t.ok() && t->state() == v1::SUCCEEDED) << t.status();
  auto r = root->Move(Ref(as->id()), Ref(ad->id()), o);
  ASSERT_TRUE(r.ok() && r->state() == v1::SUCCEEDED) << r.status();
  EXPECT_EQ(alice->Read(Ref(ad->id(), 100, 50)).value_or(""), std::string(50, 'a'));
  EXPECT_TRUE(root->ReleasePieces(list->id()).ok());
  EXPECT_EQ(seen(*alice), 0u);
}

TEST_F(AuthTest, ForwardedCallsAreCheckedWhereTheDataLives) {
  auto a = DaemonProcess::Start({"--node=a", "--heartbeat=100ms", "--auth_tokens=" + tokens_,
                                 "--cluster_secret_file=" + secret_});
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = DaemonProcess::Start({"--node=b", "--heartbeat=100ms", "--auth_tokens=" + tokens_,
                                 "--cluster_secret_file=" + secret_, "--peers=" + (*a)->address()});
  ASSERT_TRUE(b.ok()) << b.status();
  auto alice_b = As(**b, "alice-token-0123456789");
  auto bob_b = As(**b, "bob-token-0123456789");
  ASSERT_TRUE(OnePeerUp(*alice_b));
  // Alice, through node b, on node a.
  auto on_a = alice_b->Allocate(4096, v1::HOST, 0, absl::ZeroDuration(), "", "a");
  ASSERT_TRUE(on_a.ok()) << on_a.status();
  v1::BufferRef ref = Ref(on_a->id());
  ref.set_node("a");
  ASSERT_TRUE(alice_b->Write(ref, std::string(4096, 'f')).ok());
  auto local = alice_b->Allocate(4096);
  ASSERT_TRUE(local.ok());
  auto pulled = alice_b->Move(ref, Ref(local->id()), {.checksum = true});
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->state(), v1::SUCCEEDED) << pulled->error_message();
  // Bob, through node b, cannot see, read, write or release it.
  EXPECT_EQ(bob_b->GetBuffer(on_a->id(), "a").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(bob_b->Read(ref).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(bob_b->Write(ref, std::string(4096, 'x')).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(bob_b->Release(on_a->id(), "a").code(), StatusCode::kNotFound);
  auto bobs = bob_b->Allocate(4096);
  ASSERT_TRUE(bobs.ok());
  EXPECT_EQ(bob_b->Move(ref, Ref(bobs->id())).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(*alice_b->Read(ref), std::string(4096, 'f'));
  // Nobody without a token gets through b to a.
  auto anonymous = As(**b, "");
  EXPECT_EQ(anonymous->GetBuffer(on_a->id(), "a").status().code(), StatusCode::kUnauthenticated);
}

TEST_F(AuthTest, TheTokenFileIsReReadAndABadOneIsRefused) {
  auto d = DaemonProcess::Start({"--node=a", "--auth_tokens=" + tokens_});
  ASSERT_TRUE(d.ok()) << d.status();
  auto carol = As(**d, "carol-token-0123456789");
  EXPECT_EQ(carol->GetInfo().status().code(), StatusCode::kUnauthenticated);
  WriteTokens(std::string(kTokens) + "carol-token-0123456789,carol,team-c,user\n");
  bool in = false;
  for (absl::Time end = absl::Now() + absl::Seconds(10); !in && absl::Now() < end;) {
    in = carol->GetInfo().ok();
    if (!in) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(in) << "a token added to the file was not taken within 10 s";
  WriteTokens("this is not a token file\n");
  bool logged = false;
  for (absl::Time end = absl::Now() + absl::Seconds(10); !logged && absl::Now() < end;) {
    logged = absl::StrContains((*d)->Log(), "token file refused");
    if (!logged) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(logged);
  EXPECT_TRUE(carol->GetInfo().ok()) << "the tokens before a bad file were not kept";
  // A daemon does not start on a bad file.
  auto bad = DaemonProcess::Start({"--node=b", "--auth_tokens=" + tokens_});
  EXPECT_FALSE(bad.ok());
}

// Where callers need credentials, channelz (which answers without any, with other clients'
// addresses) is off unless --introspection=on, and reflection (v1 and v1alpha) answers
// only callers with credentials, listing the public services (not the peer protocol);
// health is served to anyone (probes carry no credentials).
TEST_F(AuthTest, IntrospectionIsOffWhereCallersNeedCredentials) {
  auto d = DaemonProcess::Start({"--node=a", "--auth_tokens=" + tokens_});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(EmptyCall((*d)->address(), kChannelz).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_TRUE(EmptyCall((*d)->address(), kHealth).ok());
  for (const std::string version : {"v1", "v1alpha"}) {
    std::string services;
    EXPECT_EQ(ListServices((*d)->address(), version, "", &services).error_code(),
              grpc::StatusCode::UNAUTHENTICATED)
        << version;
    EXPECT_EQ(ListServices((*d)->address(), version, "wrong-token", &services).error_code(),
              grpc::StatusCode::UNAUTHENTICATED)
        << version;
    grpc::Status st = ListServices((*d)->address(), version, "rita-token-0123456789", &services);
    EXPECT_TRUE(st.ok()) << version << ": " << st.error_message();
    EXPECT_TRUE(absl::StrContains(services, "gpumove.v1.TransferService")) << version;
    EXPECT_FALSE(absl::StrContains(services, "gpumove.peer.v1")) << version;
  }
  auto off = DaemonProcess::Start({"--node=c", "--auth_tokens=" + tokens_, "--introspection=off"});
  ASSERT_TRUE(off.ok()) << off.status();
  std::string services;
  EXPECT_EQ(ListServices((*off)->address(), "v1", "rita-token-0123456789", &services).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  auto on = DaemonProcess::Start({"--node=b", "--auth_tokens=" + tokens_, "--introspection=on"});
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(EmptyCall((*on)->address(), kChannelz).ok());
  EXPECT_FALSE(DaemonProcess::Start({"--node=c", "--introspection=maybe"}).ok());
}

// A stream opened with a token ends (UNAUTHENTICATED) once the token leaves the file,
// within the re-read period and the stream's own check: revocation is not only for new
// calls.
TEST_F(AuthTest, RevokedTokensEndTheirOpenStreams) {
  WriteTokens(std::string(kTokens) + "carol-token-0123456789,carol,team-c,user\n");
  auto d = DaemonProcess::Start({"--node=a", "--auth_tokens=" + tokens_});
  ASSERT_TRUE(d.ok()) << d.status();
  auto carol = As(**d, "carol-token-0123456789");
  v1::NotificationsRequest request;
  auto stream = carol->Subscribe(request, absl::Seconds(30));
  ASSERT_TRUE(stream.ok()) << stream.status();
  EndsUnauthenticatedWhenRevoked(**stream, [&] { WriteTokens(kTokens); });
}

// A stream relayed by the node the caller reached (b) to the node where the data lives (a)
// ends when the caller's token leaves b's file, though a (which takes the caller b
// asserts) would go on serving it: the relaying node ends it, as for a stream of its own.
TEST_F(AuthTest, RevokedTokensEndTheStreamsTheirNodeRelays) {
  WriteTokens(std::string(kTokens) + "carol-token-0123456789,carol,team-c,user\n");
  const std::string b_tokens = dir_ + "/b-tokens.csv";
  std::filesystem::copy_file(tokens_, b_tokens);
  auto a = DaemonProcess::Start({"--node=a", "--heartbeat=100ms", "--auth_tokens=" + tokens_,
                                 "--cluster_secret_file=" + secret_});
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = DaemonProcess::Start({"--node=b", "--heartbeat=100ms", "--auth_tokens=" + b_tokens,
                                 "--cluster_secret_file=" + secret_, "--peers=" + (*a)->address()});
  ASSERT_TRUE(b.ok()) << b.status();
  auto carol = As(**b, "carol-token-0123456789");
  ASSERT_TRUE(OnePeerUp(*carol));
  v1::NotificationsRequest request;
  request.set_node("a");
  auto stream = carol->Subscribe(request, absl::Seconds(30));
  ASSERT_TRUE(stream.ok()) << stream.status();
  EndsUnauthenticatedWhenRevoked(**stream, [&] {
    const std::string tmp = b_tokens + ".new";
    std::ofstream(tmp) << kTokens;
    std::filesystem::rename(tmp, b_tokens);
  });
}

TEST_F(AuthTest, NotificationsReachTheirTenantAndAdminsOnly) {
  auto d = DaemonProcess::Start({"--node=a", "--auth_tokens=" + tokens_});
  ASSERT_TRUE(d.ok()) << d.status();
  auto alice = As(**d, "alice-token-0123456789");
  auto rita = As(**d, "rita-token-0123456789");
  auto bob = As(**d, "bob-token-0123456789");
  auto root = As(**d, "root-token-0123456789");
  auto s = alice->Allocate(4096);
  auto t = alice->Allocate(4096);
  auto bs = bob->Allocate(4096);
  ASSERT_TRUE(s.ok() && t.ok() && bs.ok());
  v1::NotificationsRequest all;
  all.set_after_sequence(0);
  MoveOptions bobs;
  bobs.notify = "bob's";
  ASSERT_EQ(bob->Move(Ref(bs->id()), Ref(bs->id()), bobs).status().code(),
            StatusCode::kInvalidArgument);  // Overlapping: refused, nothing published.
  auto b2 = bob->Allocate(4096);
  ASSERT_TRUE(b2.ok());
  ASSERT_EQ(bob->Move(Ref(bs->id()), Ref(b2->id()), bobs)->state(), v1::SUCCEEDED);
  MoveOptions alices;
  alices.notify = "alice's";
  ASSERT_EQ(alice->Move(Ref(s->id()), Ref(t->id()), alices)->state(), v1::SUCCEEDED);
  // Alice's tenant (a reader of it too) sees only its own, numbered from 1; Bob only his
  // (even naming Alice's buffer); the admin both.
  for (Client* c : {alice.get(), rita.get()}) {
    auto stream = c->Subscribe(all, absl::Seconds(30));
    ASSERT_TRUE(stream.ok());
    v1::Notification n;
    ASSERT_TRUE((*stream)->Next(&n));
    EXPECT_EQ(n.notify(), "alice's");
    EXPECT_EQ(n.sequence(), 1u);
    (*stream)->Cancel();
  }
  // Naming Alice's buffer, Bob hears what he would of a buffer that does not exist
  // (NOT_FOUND: ids leak nothing); naming his own, his notifications.
  v1::NotificationsRequest alices_buffer = all;
  alices_buffer.add_buffers(t->id());
  alices_buffer.add_buffers(b2->id());
  v1::Notification n;
  {
    auto as_bob = bob->Subscribe(alices_buffer, absl::Seconds(30));
    ASSERT_TRUE(as_bob.ok());
    EXPECT_FALSE((*as_bob)->Next(&n));
    const absl::Status st = (*as_bob)->Finish();
    EXPECT_EQ(st.code(), StatusCode::kNotFound) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), t->id())) << st;
  }
  v1::NotificationsRequest bobs_buffer = all;
  bobs_buffer.add_buffers(b2->id());
  auto as_bob = bob->Subscribe(bobs_buffer, absl::Seconds(30));
  ASSERT_TRUE(as_bob.ok());
  ASSERT_TRUE((*as_bob)->Next(&n));
  EXPECT_EQ(n.notify(), "bob's");
  (*as_bob)->Cancel();
  auto as_root = root->Subscribe(all, absl::Seconds(30));
  ASSERT_TRUE(as_root.ok());
  ASSERT_TRUE((*as_root)->Next(&n));
  EXPECT_EQ(n.notify(), "bob's");
  ASSERT_TRUE((*as_root)->Next(&n));
  EXPECT_EQ(n.notify(), "alice's");
  (*as_root)->Cancel();
  // No token: no stream.
  auto anonymous = As(**d, "");
  auto refused = anonymous->Subscribe(all, absl::Seconds(30));
  ASSERT_TRUE(refused.ok());
  EXPECT_FALSE((*refused)->Next(&n));
  EXPECT_EQ((*refused)->Finish().code(), StatusCode::kUnauthenticated);
}

TEST_F(AuthTest, AnOpenDaemonSaysSo) {
  auto d = DaemonProcess::Start({"--node=a"});
  ASSERT_TRUE(d.ok()) << d.status();
  auto c = Client::Connect((*d)->address());
  ASSERT_TRUE(c.ok());
  auto info = (*c)->GetInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->authentication(), "open");
  EXPECT_TRUE(absl::StrContains((*d)->Log(), "open daemon"));
  auto e = DaemonProcess::Start({"--node=b", "--auth_tokens=" + tokens_});
  ASSERT_TRUE(e.ok());
  auto ce = Client::Connect((*e)->address(), ConnectOptions{.token = "bob-token-0123456789"});
  ASSERT_TRUE(ce.ok());
  EXPECT_EQ((*ce)->GetInfo()->authentication(), "bearer tokens");
  // Beyond this host only with credentials, or when told.
  EXPECT_FALSE(DaemonProcess::Start({"--node=c", "--listen=0.0.0.0:0"}).ok());
  auto told = DaemonProcess::Start({"--node=c", "--listen=0.0.0.0:0", "--allow_insecure"});
  EXPECT_TRUE(told.ok()) << told.status();
  auto tokens =
      DaemonProcess::Start({"--node=d", "--listen=0.0.0.0:0", "--auth_tokens=" + tokens_});
  EXPECT_TRUE(tokens.ok()) << tokens.status();
}

TEST_F(AuthTest, UnixSocketsAreForTheDaemonsUserAndGroupOnly) {
  // Socket paths are short (108 bytes): a directory of /tmp, not the test's.
  char sockets[] = "/tmp/gpumove-auth-XXXXXX";
  ASSERT_NE(mkdtemp(sockets), nullptr);
  const std::string dir = sockets;
  absl::Cleanup remove = [&] { std::filesystem::remove_all(dir); };
  const std::string path = dir + "/gpumoved.sock";
  auto d = DaemonProcess::Start({"--node=a", "--listen=unix:" + path});
  ASSERT_TRUE(d.ok()) << d.status();
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  const std::string other = dir + "/other.sock";
  auto e = DaemonProcess::Start({"--node=b", "--listen=unix:" + other, "--unix_socket_mode=0600"});
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(stat(other.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_FALSE(DaemonProcess::Start(
                   {"--node=c", "--listen=unix:" + dir + "/c.sock", "--unix_socket_mode=rw"})
                   .ok());
}

}  // namespace
}  // namespace gpumove

namespace gpumove {
namespace {

// Per-tenant quotas (--quotas): bytes of a pool kind and transfers in flight, past which a
// tenant gets RESOURCE_EXHAUSTED while other tenants and admins go on; a release gives
// the bytes back; the file is re-read on change.
// Pools are shared by tenants: a buffer handed to one never shows what another left in
// the same bytes. The control daemon (--scrub_memory=never) shows the test reaches them.
TEST_F(AuthTest, ABufferNeverShowsAnotherTenantsOldBytes) {
  for (const std::string scrub : {"auto", "never"}) {
    SCOPED_TRACE(scrub);
    auto d = DaemonProcess::Start({"--node=a", "--auth_tokens=" + tokens_, "--host_pool_size=4MiB",
                                   "--scrub_memory=" + scrub});
    ASSERT_TRUE(d.ok()) << d.status();
    auto alice = As(**d, "alice-token-0123456789");
    auto bob = As(**d, "bob-token-0123456789");
    const std::string secret(64 << 10, 'Z');
    auto a = alice->Allocate(secret.size());
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(alice->Write(Ref(a->id()), secret).ok());
    ASSERT_TRUE(alice->Release(a->id()).ok());
    auto b = bob->Allocate(secret.size());  // Best fit in an empty pool: the same bytes.
    ASSERT_TRUE(b.ok()) << b.status();
    auto seen = bob->Read(Ref(b->id()));
    ASSERT_TRUE(seen.ok()) << seen.status();
    if (scrub == "never") {
      EXPECT_EQ(*seen, secret);
    } else {
      EXPECT_EQ(*seen, std::string(secret.size(), '\0'));
    }
  }
  EXPECT_FALSE(DaemonProcess::Start({"--node=a", "--scrub_memory=sometimes"}).ok());
}

TEST_F(AuthTest, QuotasHoldPerTenant) {
  const std::string quotas = dir_ + "/quotas.csv";
  std::ofstream(quotas) << "# tenant,host,pinned,device,transfers\n"
                           "team-a,1MiB,-,-,1\n"
                           "*,-,64KiB,-,-\n";
  auto d = DaemonProcess::Start(
      {"--node=a", "--auth_tokens=" + tokens_, "--quotas=" + quotas, "--max_move_rate=1MiB"});
  ASSERT_TRUE(d.ok()) << d.status();
  auto alice = As(**d, "alice-token-0123456789");
  auto bob = As(**d, "bob-token-0123456789");
  auto root = As(**d, "root-token-0123456789");
  auto first = alice->Allocate(512 << 10);
  ASSERT_TRUE(first.ok()) << first.status();
  auto small = alice->Allocate(512 << 10);  // Exactly up to the quota.
  ASSERT_TRUE(small.ok()) << small.status();
  auto second = alice->Allocate(4096);
  EXPECT_EQ(second.status().code(), StatusCode::kResourceExhausted) << second.status();
  EXPECT_TRUE(absl::StrContains(second.status().message(), "quota")) << second.status();
  // Other tenants: the default line (pinned only); admins: no quota.
  EXPECT_TRUE(bob->Allocate(2 << 20).ok());
  EXPECT_EQ(bob->Allocate(128 << 10, v1::PINNED_HOST).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_TRUE(root->Allocate(2 << 20).ok());
  // Releasing gives the bytes back.
  ASSERT_TRUE(alice->Release(small->id()).ok());
  auto again = alice->Allocate(512 << 10);
  ASSERT_TRUE(again.ok()) << again.status();

  // One transfer in flight for team-a: a 512 KiB move at 1 MiB/s runs half a second.
  MoveOptions no_wait;
  no_wait.wait = false;
  auto running = alice->Move(Ref(first->id()), Ref(again->id()), no_wait);
  ASSERT_TRUE(running.ok()) << running.status();
  auto refused = alice->Move(Ref(first->id()), Ref(again->id()), no_wait);
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted) << refused.status();
  auto done = alice->Wait(running->id(), absl::Seconds(20));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->error_message();
  auto after = alice->Move(Ref(first->id()), Ref(again->id()));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->state(), v1::SUCCEEDED);

  // A new file: team-a may hold no more host bytes at all.
  {
    const std::string tmp = quotas + ".new";
    std::ofstream(tmp) << "team-a,0,-,-,-\n";
    std::filesystem::rename(tmp, quotas);
  }
  bool applied = false;
  for (absl::Time end = absl::Now() + absl::Seconds(10); !applied && absl::Now() < end;) {
    auto b = alice->Allocate(4096);
    applied = b.status().code() == StatusCode::kResourceExhausted;
    if (b.ok()) ASSERT_TRUE(alice->Release(b->id()).ok());
    if (!applied) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(applied);
}

}  // namespace
}  // namespace gpumove

namespace gpumove {
namespace {

// Runs the gpumovectl `ctl` (a copy anyone may run) with `args` as uid/gid `id`: its exit
// code and output.
std::pair<int, std::string> RunAs(uid_t id, const std::string& ctl,
                                  const std::vector<std::string>& args) {
  int out[2];
  if (pipe(out) != 0) return {-1, "pipe"};
  // Made before fork: the child of a threaded process only execs.
  std::vector<char*> argv = {const_cast<char*>(ctl.c_str())};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(out[1], 2);
    close(out[0]);
    if (setgroups(0, nullptr) != 0 || setgid(id) != 0 || setuid(id) != 0) {
      dprintf(1, "cannot become uid %d: %s\n", static_cast<int>(id), std::strerror(errno));
      _exit(126);
    }
    execv(ctl.c_str(), argv.data());
    _exit(127);
  }
  close(out[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(out[0], buf, sizeof(buf))) > 0;) text.append(buf, n);
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text};
}

// --unix_socket_principals: a unix socket caller is the principal its uid (SO_PEERCRED)
// names, without a token; a token still wins; the same caller over TCP has no identity;
// a uid the file does not name is refused, and the file is re-read.
TEST_F(AuthTest, UnixSocketCallersAreKnownByUid) {
  char sockets[] = "/tmp/gpumove-uid-XXXXXX";
  ASSERT_NE(mkdtemp(sockets), nullptr);
  const std::string dir = sockets;
  absl::Cleanup remove = [&] { std::filesystem::remove_all(dir); };
  const std::string path = dir + "/gpumoved.sock", users = dir_ + "/users.csv";
  std::ofstream(users) << "# user,principal,tenant,role\n"
                       << getuid() << ",unix-alice,team-a,user\n";
  EXPECT_FALSE(DaemonProcess::Start({"--node=x", "--unix_socket_principals=" + users}).ok());
  auto d = DaemonProcess::Start({"--node=a", "--listen=127.0.0.1:0", "--listen=unix:" + path,
                                 "--unix_socket_mode=0666", "--auth_tokens=" + tokens_,
                                 "--unix_socket_principals=" + users});
  ASSERT_TRUE(d.ok()) << d.status();
  ConnectOptions o;
  auto local = Client::Connect("unix:" + path, o);
  ASSERT_TRUE(local.ok()) << local.status();
  auto mine = (*local)->Allocate(4096);
  ASSERT_TRUE(mine.ok()) << mine.status() << (*d)->Log();
  EXPECT_EQ(mine->owner(), "team-a");
  o.token = "bob-token-0123456789";
  auto bob_local = Client::Connect("unix:" + path, o);
  ASSERT_TRUE(bob_local.ok());
  auto bobs = (*bob_local)->Allocate(4096);
  ASSERT_TRUE(bobs.ok()) << bobs.status();
  EXPECT_EQ(bobs->owner(), "team-b");
  auto listed = (*local)->ListBuffers();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);  // Team-a's only.
  EXPECT_EQ(listed->front().id(), mine->id());
  auto alice = As(**d, "alice-token-0123456789");  // Over TCP, of the same tenant.
  ASSERT_NE(alice, nullptr);
  EXPECT_TRUE(alice->GetBuffer(mine->id()).ok());
  o.token.clear();
  auto tcp = Client::Connect((*d)->address(), o);
  ASSERT_TRUE(tcp.ok());
  EXPECT_EQ((*tcp)->ListBuffers().status().code(), StatusCode::kUnauthenticated);

  // This uid dropped from the file: refused.
  std::ofstream(users, std::ios::trunc) << "12345,someone,team-c,user\n";
  StatusCode got = StatusCode::kOk;
  for (int i = 0; i < 50 && got == StatusCode::kOk; ++i) {
    absl::SleepFor(absl::Milliseconds(200));
    got = (*local)->ListBuffers().status().code();
  }
  EXPECT_EQ(got, StatusCode::kUnauthenticated);

  // Another uid (root only can become one): refused until the file names it.
  if (getuid() == 0) {
    const std::string ctl = dir + "/gpumovectl";
    std::filesystem::copy_file(FindBuiltBinary("client/cli/gpumovectl", "GPUMOVECTL"), ctl);
    ASSERT_EQ(chmod(ctl.c_str(), 0755), 0);
    ASSERT_EQ(chmod(dir.c_str(), 0755), 0);
    auto [code, text] = RunAs(65534, ctl, {"--addr=unix:" + path, "ls"});
    if (code == 126) GTEST_SKIP() << "SKIPPED (the rest): " << text;
    EXPECT_NE(code, 0) << text;
    EXPECT_TRUE(absl::StrContains(text, "uid 65534 names no principal")) << text;
    std::ofstream(users, std::ios::trunc) << "65534,nobody-reader,team-a,reader\n";
    bool seen = false;
    for (int i = 0; i < 50 && !seen; ++i) {
      absl::SleepFor(absl::Milliseconds(200));
      auto [c, t] = RunAs(65534, ctl, {"--addr=unix:" + path, "ls"});
      seen = c == 0 && absl::StrContains(t, mine->id()) && !absl::StrContains(t, bobs->id());
    }
    EXPECT_TRUE(seen) << RunAs(65534, ctl, {"--addr=unix:" + path, "ls"}).second << (*d)->Log();
    auto [alloc, said] = RunAs(65534, ctl, {"--addr=unix:" + path, "alloc", "4KiB"});
    EXPECT_NE(alloc, 0);
    EXPECT_TRUE(absl::StrContains(said, "PERMISSION_DENIED")) << said;
  } else {
    std::cout << "SKIPPED (part): another uid's connection needs root to become it\n";
  }
}

}  // namespace
}  // namespace gpumove
