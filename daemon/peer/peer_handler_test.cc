// The peer protocol's holding side in-process: a PeerHandler over a real cluster table,
// buffer registry and hold table, called as the gRPC and UCX adapters call it, with the
// requests a peer (or a forger of peers) may send.
#include "daemon/peer/peer_handler.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/cluster/peer_auth.h"
#include "daemon/core/buffer_registry.h"
#include "daemon/gpu/gpu.h"
#include "daemon/memory/pool.h"
#include "daemon/peer/call_parse.h"
#include "daemon/peer/peer_service.h"

namespace gpumove {
namespace {

using absl::StatusCode;

constexpr uint64_t kIncarnation = 5;
constexpr uint64_t kHashed = 7;  // What the table's hasher says of any range.

class PeerHandlerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PoolSizes sizes;
    sizes.host = 16 << 20;
    sizes.pinned = 0;
    pools_ = *PoolSet::Create(sizes, {}, gpu_.get());
    registry_ = std::make_unique<BufferRegistry>(pools_.get(), absl::ZeroDuration());
    holds_ = std::make_unique<HoldTable>(registry_.get(), [](const Endpoint&, uint64_t) {
      return absl::StatusOr<uint64_t>(kHashed);
    });
    peer::v1::NodeDescriptor self;
    self.set_node("b");
    self.set_address("127.0.0.1:2");
    self.set_incarnation(1);
    cluster_ = std::make_unique<Cluster>(ClusterOptions(), self);
    // A path of the test's own: "echo" answers the body reversed (and may run anywhere),
    // "wait" answers the caller's name (a thread that may wait's).
    ASSERT_TRUE(path_calls_
                    .Register("test", "echo", /*at_once=*/true,
                              [this](const PathCaller&, absl::string_view body) {
                                ++served_;
                                return std::string(body.rbegin(), body.rend());
                              })
                    .ok());
    ASSERT_TRUE(path_calls_
                    .Register("test", "wait", /*at_once=*/false,
                              [this](const PathCaller& caller, absl::string_view) {
                                ++served_;
                                return absl::StrCat(caller.node, "#", caller.incarnation);
                              })
                    .ok());
    handler_ = std::make_unique<PeerHandler>(cluster_.get(), holds_.get(),
                                             std::vector<PathHolder*>{}, &path_calls_);
    AllocateOptions o;
    o.size = 1 << 20;
    o.owner = "alice";
    alices_ = registry_->Allocate(o)->id;
    o.owner = "bob";
    bobs_ = registry_->Allocate(o)->id;
  }

  // Node "a" says Hello (at kIncarnation): a peer from now on.
  void MeetA() {
    peer::v1::HelloRequest hello;
    hello.mutable_from()->set_node("a");
    hello.mutable_from()->set_address("127.0.0.1:1");
    hello.mutable_from()->set_incarnation(kIncarnation);
    peer::v1::HelloResponse answer;
    ASSERT_TRUE(handler_->Hello(hello, &answer).ok());
    EXPECT_EQ(answer.node().node(), "b");
  }

  // Node a's hold of alice's buffer [offset, offset + length) for transfer `id`.
  peer::v1::PrepareRemoteRequest Ask(const std::string& id, uint64_t offset = 0,
                                     uint64_t length = 4096) {
    peer::v1::PrepareRemoteRequest r;
    r.set_transfer_id(id);
    r.set_from_node("a");
    r.set_from_incarnation(kIncarnation);
    r.set_owner("alice");
    r.mutable_range()->set_buffer_id(alices_);
    r.mutable_range()->set_offset(offset);
    r.mutable_range()->set_length(length);
    r.set_write(true);
    return r;
  }

  // Node a's call of the test path's `method`.
  peer::v1::PathCallRequest PathCall(const std::string& method, const std::string& body = "abc") {
    peer::v1::PathCallRequest r;
    r.set_path("test");
    r.set_method(method);
    r.set_from_node("a");
    r.set_from_incarnation(kIncarnation);
    r.set_body(body);
    return r;
  }
  absl::StatusCode Call(const peer::v1::PathCallRequest& r) {
    peer::v1::PathCallResponse response;
    return handler_->PathCall(r, &response).code();
  }

  absl::StatusCode Prepare(const peer::v1::PrepareRemoteRequest& r) {
    peer::v1::PrepareRemoteResponse response;
    return handler_->PrepareRemote(r, &response).code();
  }

  uint64_t UsesOf(const std::string& owner, const std::string& id) {
    return registry_->Get(owner, id)->active_uses;
  }

  std::unique_ptr<GpuRuntime> gpu_ = GpuRuntime::CreateHostOnly("test");
  std::unique_ptr<PoolSet> pools_;
  std::unique_ptr<BufferRegistry> registry_;
  std::unique_ptr<HoldTable> holds_;
  std::unique_ptr<Cluster> cluster_;
  PathCalls path_calls_;
  int served_ = 0;  // Path calls that reached a handler.
  std::unique_ptr<PeerHandler> handler_;
  std::string alices_, bobs_;
};

TEST_F(PeerHandlerTest, AMetPeerHoldsARangeAndItsAcknowledgementEndsTheHold) {
  MeetA();
  peer::v1::PrepareRemoteResponse held;
  ASSERT_TRUE(handler_->PrepareRemote(Ask("t1", 4096, 8192), &held).ok());
  EXPECT_EQ(held.length(), 8192u);
  EXPECT_EQ(held.kind(), v1::HOST);
  EXPECT_NE(held.address(), 0u);
  EXPECT_EQ(holds_->size(), 1u);
  EXPECT_EQ(UsesOf("alice", alices_), 1u);
  // The same transfer again is not a second hold.
  EXPECT_EQ(Prepare(Ask("t1")), StatusCode::kAlreadyExists);
  EXPECT_EQ(holds_->size(), 1u);

  peer::v1::CompleteRemoteRequest ack;
  ack.set_transfer_id("t1");
  ack.set_from_node("a");
  ack.set_checksum(true);
  peer::v1::CompleteRemoteResponse answer;
  ASSERT_TRUE(handler_->CompleteRemote(ack, &answer).ok());
  EXPECT_EQ(answer.xxh3(), kHashed);
  EXPECT_EQ(holds_->size(), 0u);
  EXPECT_EQ(UsesOf("alice", alices_), 0u);
  // Acknowledged twice, or never held: nothing to end.
  EXPECT_EQ(handler_->CompleteRemote(ack, &answer).code(), StatusCode::kNotFound);
}

TEST_F(PeerHandlerTest, NodesThatNeverSaidHelloHoldNothing) {
  EXPECT_EQ(Prepare(Ask("t1")), StatusCode::kFailedPrecondition);
  MeetA();
  peer::v1::PrepareRemoteRequest stale = Ask("t2");
  stale.set_from_incarnation(kIncarnation - 1);  // An incarnation that is not up.
  EXPECT_EQ(Prepare(stale), StatusCode::kFailedPrecondition);
  peer::v1::PrepareRemoteRequest stranger = Ask("t3");
  stranger.set_from_node("z");
  EXPECT_EQ(Prepare(stranger), StatusCode::kFailedPrecondition);
  EXPECT_EQ(holds_->size(), 0u);
  EXPECT_EQ(UsesOf("alice", alices_), 0u);
}

TEST_F(PeerHandlerTest, BadHoldsAreRefusedAndChangeNothing) {
  MeetA();
  peer::v1::PrepareRemoteRequest no_id = Ask("");
  EXPECT_EQ(Prepare(no_id), StatusCode::kInvalidArgument);
  // Another tenant's buffer is not found for alice; a buffer that does not exist neither.
  peer::v1::PrepareRemoteRequest bobs = Ask("t1");
  bobs.mutable_range()->set_buffer_id(bobs_);
  EXPECT_EQ(Prepare(bobs), StatusCode::kNotFound);
  peer::v1::PrepareRemoteRequest missing = Ask("t2");
  missing.mutable_range()->set_buffer_id("b-nope");
  EXPECT_EQ(Prepare(missing), StatusCode::kNotFound);
  // Past the buffer's end, and an offset + length that wraps.
  EXPECT_NE(Prepare(Ask("t3", (1 << 20) - 100, 4096)), StatusCode::kOk);
  EXPECT_NE(Prepare(Ask("t4", UINT64_MAX - 10, 4096)), StatusCode::kOk);
  // Piece lists of a bad form or outside the range.
  peer::v1::PrepareRemoteRequest uneven = Ask("t5");
  uneven.mutable_pieces()->add_offsets(0);
  uneven.mutable_pieces()->add_offsets(64);
  uneven.mutable_pieces()->add_lengths(8);
  EXPECT_EQ(Prepare(uneven), StatusCode::kInvalidArgument);
  peer::v1::PrepareRemoteRequest outside = Ask("t6");
  outside.mutable_pieces()->add_offsets(4000);
  outside.mutable_pieces()->set_length(200);
  EXPECT_NE(Prepare(outside), StatusCode::kOk);
  EXPECT_EQ(holds_->size(), 0u);
  EXPECT_EQ(UsesOf("alice", alices_), 0u);
  EXPECT_EQ(UsesOf("bob", bobs_), 0u);
}

TEST_F(PeerHandlerTest, BatchesAreBoundedAndAnswerEachItem) {
  MeetA();
  peer::v1::PrepareRemoteBatchRequest empty;
  peer::v1::PrepareRemoteBatchResponse answered;
  EXPECT_EQ(handler_->PrepareRemoteBatch(empty, &answered).code(), StatusCode::kInvalidArgument);
  peer::v1::PrepareRemoteBatchRequest huge;
  for (size_t i = 0; i <= kMaxPeerBatch; ++i) *huge.add_items() = Ask("h");
  EXPECT_EQ(handler_->PrepareRemoteBatch(huge, &answered).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(holds_->size(), 0u);

  peer::v1::PrepareRemoteBatchRequest mixed;
  *mixed.add_items() = Ask("good");
  peer::v1::PrepareRemoteRequest bad = Ask("bad");
  bad.mutable_range()->set_buffer_id(bobs_);
  *mixed.add_items() = bad;
  ASSERT_TRUE(handler_->PrepareRemoteBatch(mixed, &answered).ok());
  ASSERT_EQ(answered.results_size(), 2);
  EXPECT_EQ(answered.results(0).code(), 0);
  EXPECT_EQ(answered.results(1).code(), static_cast<int>(StatusCode::kNotFound));
  EXPECT_EQ(holds_->size(), 1u);

  peer::v1::CompleteRemoteBatchRequest acks;
  for (const char* id : {"good", "bad"}) {
    peer::v1::CompleteRemoteRequest* ack = acks.add_items();
    ack->set_transfer_id(id);
    ack->set_from_node("a");
  }
  peer::v1::CompleteRemoteBatchResponse acked;
  ASSERT_TRUE(handler_->CompleteRemoteBatch(acks, &acked).ok());
  ASSERT_EQ(acked.results_size(), 2);
  EXPECT_EQ(acked.results(0).code(), 0);
  EXPECT_EQ(acked.results(1).code(), static_cast<int>(StatusCode::kNotFound));
  EXPECT_EQ(holds_->size(), 0u);
  EXPECT_EQ(UsesOf("alice", alices_), 0u);
}

TEST_F(PeerHandlerTest, ARegisteredPathCallIsAnsweredByItsHandler) {
  MeetA();
  peer::v1::PathCallResponse answer;
  ASSERT_TRUE(handler_->PathCall(PathCall("echo", "hello"), &answer).ok());
  EXPECT_EQ(answer.body(), "olleh");
  ASSERT_TRUE(handler_->PathCall(PathCall("wait"), &answer).ok());
  EXPECT_EQ(answer.body(), absl::StrCat("a#", kIncarnation));  // The caller, as checked.
  EXPECT_EQ(served_, 2);
}

TEST_F(PeerHandlerTest, PathCallsNobodyRegisteredAreUnimplementedAndChangeNothing) {
  MeetA();
  peer::v1::PrepareRemoteResponse held;
  ASSERT_TRUE(handler_->PrepareRemote(Ask("t1"), &held).ok());
  peer::v1::PathCallRequest other_method = PathCall("nope");
  peer::v1::PathCallRequest other_path = PathCall("echo");
  other_path.set_path("ucx");
  other_path.set_method("stage_chunk");  // A path this node does not run.
  for (const auto& r : {other_method, other_path}) {
    peer::v1::PathCallResponse answer;
    const absl::Status st = handler_->PathCall(r, &answer);
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), absl::StrCat("\"", r.method(), "\""))) << st;
    EXPECT_TRUE(answer.body().empty());
  }
  EXPECT_EQ(served_, 0);
  EXPECT_EQ(holds_->size(), 1u);  // The hold itself is untouched.
  EXPECT_EQ(UsesOf("alice", alices_), 1u);
}

TEST_F(PeerHandlerTest, PathCallsFromNodesNeverMetAreRefusedBeforeTheirHandler) {
  EXPECT_EQ(Call(PathCall("echo")), StatusCode::kFailedPrecondition);  // Before Hello.
  MeetA();
  peer::v1::PathCallRequest stale = PathCall("echo");
  stale.set_from_incarnation(kIncarnation - 1);
  EXPECT_EQ(Call(stale), StatusCode::kFailedPrecondition);
  peer::v1::PathCallRequest stranger = PathCall("echo");
  stranger.set_from_node("z");
  EXPECT_EQ(Call(stranger), StatusCode::kFailedPrecondition);
  // Unknown names are not looked up for a stranger either: the caller is checked first.
  stranger.set_method("nope");
  EXPECT_EQ(Call(stranger), StatusCode::kFailedPrecondition);
  EXPECT_EQ(served_, 0);
}

// With a cluster secret, the gRPC adapter checks the stamp before the handler sees the
// call; without one it serves it.
TEST_F(PeerHandlerTest, UnstampedPathCallsAreRefusedBeforeTheirHandler) {
  MeetA();
  PeerAuth auth("peer-handler-test-secret-0123456789", "b", 1);
  PeerServiceImpl checked(handler_.get(), &auth);
  grpc::ServerContext context;
  const peer::v1::PathCallRequest r = PathCall("echo");
  peer::v1::PathCallResponse answer;
  EXPECT_EQ(checked.PathCall(&context, &r, &answer).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  PeerServiceImpl closed(handler_.get(), nullptr, /*closed=*/true);
  grpc::ServerContext context2;
  EXPECT_EQ(closed.PathCall(&context2, &r, &answer).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(served_, 0);
  PeerServiceImpl open(handler_.get());
  grpc::ServerContext context3;
  ASSERT_TRUE(open.PathCall(&context3, &r, &answer).ok());
  EXPECT_EQ(answer.body(), "cba");
  EXPECT_EQ(served_, 1);
}

TEST_F(PeerHandlerTest, OversizedPathCallsAreRefusedBeforeTheirHandler) {
  MeetA();
  EXPECT_EQ(Call(PathCall("echo", std::string(PathCalls::kMaxBody + 1, 'x'))),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(Call(PathCall(std::string(PathCalls::kMaxName + 1, 'm'))),
            StatusCode::kInvalidArgument);
  peer::v1::PathCallRequest long_path = PathCall("echo");
  long_path.set_path(std::string(PathCalls::kMaxName + 1, 'p'));
  EXPECT_EQ(Call(long_path), StatusCode::kInvalidArgument);
  EXPECT_EQ(Call(PathCall("")), StatusCode::kInvalidArgument);
  EXPECT_EQ(served_, 0);
  // At the bounds: served.
  EXPECT_EQ(Call(PathCall("echo", std::string(PathCalls::kMaxBody, 'x'))), StatusCode::kOk);
  EXPECT_EQ(served_, 1);
}

TEST_F(PeerHandlerTest, PathCallRegistrationsAreCheckedAndTypedBodiesParsed) {
  PathCalls calls;
  const auto any = [](const PathCaller&, absl::string_view) { return std::string(); };
  EXPECT_EQ(calls.Register("", "m", false, any).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(calls.Register("p", std::string(PathCalls::kMaxName + 1, 'm'), false, any).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(calls.Register("p", "m", false, any).ok());
  EXPECT_EQ(calls.Register("p", "m", true, any).code(), StatusCode::kAlreadyExists);
  EXPECT_FALSE(calls.Find("p", "m")->at_once);  // The first registration stands.
  EXPECT_EQ(calls.Find("p", "n"), nullptr);
  ASSERT_TRUE(
      (RegisterPathCall<peer::v1::StopMpiRequest, peer::v1::StopMpiResponse>(
           &calls, "p", "typed", false,
           [](const PathCaller&, const peer::v1::StopMpiRequest& r, peer::v1::StopMpiResponse*) {
             return r.transfer_id() == "t" ? absl::OkStatus() : absl::NotFoundError("no such hold");
           }))
          .ok());
  const PathCallHandler& typed = calls.Find("p", "typed")->handler;
  peer::v1::StopMpiRequest stop;
  stop.set_transfer_id("t");
  EXPECT_TRUE(typed(PathCaller{"a", 1}, stop.SerializeAsString()).ok());
  stop.set_transfer_id("u");
  EXPECT_EQ(typed(PathCaller{"a", 1}, stop.SerializeAsString()).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(typed(PathCaller{"a", 1}, "\xff\xff").status().code(), StatusCode::kInvalidArgument);
}

// The UCX channel parses each call once: the parse says whether the call may run on the
// progress thread and runs the handler on the same parsed request.
TEST_F(PeerHandlerTest, UcxCallsAreParsedOnceAndRunWhereTheyMay) {
  MeetA();
  const auto method = [](PeerMethod m) { return static_cast<uint32_t>(m); };
  EXPECT_EQ(ParsePeerCall(handler_.get(), method(PeerMethod::kPrepareRemoteBatch), "\xff\xff")
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ParsePeerCall(handler_.get(), 9999, "").status().code(), StatusCode::kUnimplemented);

  peer::v1::PrepareRemoteBatchRequest batch;
  *batch.add_items() = Ask("u1");
  auto call = ParsePeerCall(handler_.get(), method(PeerMethod::kPrepareRemoteBatch),
                            batch.SerializeAsString());
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_TRUE(call->at_once);  // No path holder here whose offer blocks.
  absl::Status answered = absl::UnknownError("not answered");
  std::string body;
  call->run([&](const absl::Status& st, std::string answer) {
    answered = st;
    body = std::move(answer);
  });
  ASSERT_TRUE(answered.ok()) << answered;
  peer::v1::PrepareRemoteBatchResponse response;
  ASSERT_TRUE(response.ParseFromString(body));
  ASSERT_EQ(response.results_size(), 1);
  EXPECT_EQ(response.results(0).code(), 0);
  EXPECT_EQ(holds_->size(), 1u);

  // An acknowledgement that hashes the range may take long: a serving thread's.
  peer::v1::CompleteRemoteBatchRequest acks;
  peer::v1::CompleteRemoteRequest* ack = acks.add_items();
  ack->set_transfer_id("u1");
  ack->set_from_node("a");
  ack->set_checksum(true);
  auto hashed = ParsePeerCall(handler_.get(), method(PeerMethod::kCompleteRemoteBatch),
                              acks.SerializeAsString());
  ASSERT_TRUE(hashed.ok());
  EXPECT_FALSE(hashed->at_once);
  ack->set_checksum(false);
  auto plain = ParsePeerCall(handler_.get(), method(PeerMethod::kCompleteRemoteBatch),
                             acks.SerializeAsString());
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->at_once);
  plain->run([&](const absl::Status& st, std::string) { answered = st; });
  EXPECT_TRUE(answered.ok()) << answered;
  EXPECT_EQ(holds_->size(), 0u);

  // A path call runs where its registration says, parsed once.
  auto echo = ParsePeerCall(handler_.get(), method(PeerMethod::kPathCall),
                            PathCall("echo", "xyz").SerializeAsString());
  ASSERT_TRUE(echo.ok());
  EXPECT_TRUE(echo->at_once);
  echo->run([&](const absl::Status& st, std::string answer) {
    answered = st;
    body = std::move(answer);
  });
  ASSERT_TRUE(answered.ok()) << answered;
  peer::v1::PathCallResponse echoed;
  ASSERT_TRUE(echoed.ParseFromString(body));
  EXPECT_EQ(echoed.body(), "zyx");
  auto wait = ParsePeerCall(handler_.get(), method(PeerMethod::kPathCall),
                            PathCall("wait").SerializeAsString());
  ASSERT_TRUE(wait.ok());
  EXPECT_FALSE(wait->at_once);
  auto unknown = ParsePeerCall(handler_.get(), method(PeerMethod::kPathCall),
                               PathCall("nope").SerializeAsString());
  ASSERT_TRUE(unknown.ok());
  EXPECT_TRUE(unknown->at_once);  // Refused at once.
  unknown->run([&](const absl::Status& st, std::string) { answered = st; });
  EXPECT_EQ(answered.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(served_, 1);
}

}  // namespace
}  // namespace gpumove
