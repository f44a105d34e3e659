// Bounds a real gpumoved keeps on what clients send and what it answers (issue 48): a
// label, idempotency key, id or node name past its limit is INVALID_ARGUMENT and changes
// nothing, however large; listings (buffers, transfers, prepared piece lists) come in
// pages of at most 1000 that a token walks once each, in order, and a token the node did
// not make is refused. Raw stubs where the client library would follow the pages itself.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/gpumove_client.h"
#include "gtest/gtest.h"
#include "proto/gpumove/v1/gpumove.grpc.pb.h"
#include "tests/util/daemon_process.h"

namespace gpumove {
namespace {

using ::absl::StatusCode;

// One daemon, its client, and raw stubs on a channel of its own.
class Node {
 public:
  explicit Node(std::vector<std::string> flags = {}) {
    flags.push_back("--host_pool_size=64MiB");
    flags.push_back("--pinned_pool_size=16MiB");
    auto p = DaemonProcess::Start(flags);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return;
    process = *std::move(p);
    auto c = Client::Connect(process->address());
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return;
    client = *std::move(c);
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(64 << 20);
    args.SetMaxReceiveMessageSize(64 << 20);
    auto channel =
        grpc::CreateCustomChannel(process->address(), grpc::InsecureChannelCredentials(), args);
    buffers = v1::BufferService::NewStub(channel);
    transfers = v1::TransferService::NewStub(channel);
  }
  bool ok() const { return client != nullptr; }

  absl::StatusOr<v1::ListBuffersResponse> ListBuffers(const v1::ListBuffersRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    v1::ListBuffersResponse response;
    absl::Status st = FromGrpcStatus(buffers->List(&context, request, &response));
    if (!st.ok()) return st;
    return response;
  }
  absl::StatusOr<v1::ListTransfersResponse> ListTransfers(
      const v1::ListTransfersRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    v1::ListTransfersResponse response;
    absl::Status st = FromGrpcStatus(transfers->List(&context, request, &response));
    if (!st.ok()) return st;
    return response;
  }
  absl::Status Allocate(const v1::AllocateRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    v1::Buffer response;
    return FromGrpcStatus(buffers->Allocate(&context, request, &response));
  }

  std::unique_ptr<DaemonProcess> process;
  std::unique_ptr<Client> client;
  std::unique_ptr<v1::BufferService::Stub> buffers;
  std::unique_ptr<v1::TransferService::Stub> transfers;
};

// INVALID_ARGUMENT that names `field`, in a message that does not echo the value.
void ExpectRefused(const absl::Status& st, absl::string_view field) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), field)) << st;
  EXPECT_LT(st.message().size(), 2048u) << "the message echoes the value";
}

TEST(Limits, LongStringsAreRefusedAndChangeNothing) {
  Node n;
  ASSERT_TRUE(n.ok()) << (n.process ? n.process->Log() : "");

  // Labels: 16 MiB and 257 bytes refused, nothing allocated; 256 bytes kept as given.
  const std::string huge(16 << 20, 'L');
  ExpectRefused(n.client->Allocate(4096, v1::HOST, 0, absl::ZeroDuration(), huge).status(),
                "label");
  ExpectRefused(
      n.client->Allocate(4096, v1::HOST, 0, absl::ZeroDuration(), std::string(257, 'l')).status(),
      "label");
  v1::AllocateRequest raw;
  raw.set_size(4096);
  raw.set_label(std::string(300, 'r'));
  ExpectRefused(n.Allocate(raw), "label");
  ASSERT_TRUE(n.client->ListBuffers()->empty());
  const std::string label(256, 'k');
  auto kept = n.client->Allocate(4096, v1::HOST, 0, absl::ZeroDuration(), label);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->label(), label);
  auto listed = n.client->ListBuffers();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ(listed->front().id(), kept->id());
  EXPECT_EQ(listed->front().label(), label);

  // Idempotency keys and transfer labels: refused before any transfer is made.
  auto other = n.client->Allocate(4096);
  ASSERT_TRUE(other.ok()) << other.status();
  MoveOptions long_key;
  long_key.idempotency_key = std::string(300, 'i');
  ExpectRefused(n.client->Move(Ref(kept->id()), Ref(other->id()), long_key).status(),
                "idempotency_key");
  v1::SubmitRequest submit;
  v1::TransferSpec* spec = submit.add_transfers();
  *spec->mutable_source() = Ref(kept->id());
  *spec->mutable_destination() = Ref(other->id());
  spec->set_label(std::string(257, 's'));
  submit.set_wait(true);
  ExpectRefused(n.client->Submit(submit).status(), "transfers[0].label");
  spec->set_label("");
  submit.set_idempotency_key(std::string(257, 'j'));
  ExpectRefused(n.client->Submit(submit).status(), "idempotency_key");
  MoveOptions long_label;
  long_label.label = std::string(257, 't');
  ExpectRefused(n.client->Move(Ref(kept->id()), Ref(other->id()), long_label).status(),
                "label");
  EXPECT_TRUE(n.client->ListTransfers()->empty());
  MoveOptions at_limit;
  at_limit.idempotency_key = std::string(256, 'i');
  at_limit.label = std::string(256, 't');
  auto moved = n.client->Move(Ref(kept->id()), Ref(other->id()), at_limit);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->state(), v1::SUCCEEDED) << moved->error_message();

  // Node names and ids: 1 KiB is looked for (and not found), past it is refused.
  v1::ListBuffersRequest list;
  list.set_node(std::string(5000, 'n'));
  ExpectRefused(n.ListBuffers(list).status(), "node");
  ExpectRefused(n.client->ListBuffers(std::string(5000, 'n')).status(), "node");
  EXPECT_EQ(n.client->GetBuffer(std::string(1024, 'b')).status().code(), StatusCode::kNotFound);
  ExpectRefused(n.client->GetBuffer(std::string(1025, 'b')).status(), "buffer_id");
  ExpectRefused(n.client->GetTransfer(std::string(4096, 't')).status(), "id");
  // Write checks its first message's target on its own path (a stream, no request).
  v1::BufferRef far = Ref(other->id());
  far.set_node(std::string(2000, 'w'));
  ExpectRefused(n.client->Write(far, "abc").status(), "node");

  // Still serving, and nothing more was made.
  EXPECT_TRUE(n.client->GetInfo().ok());
  EXPECT_EQ(n.client->ListBuffers()->size(), 2u);
  EXPECT_EQ(n.client->ListTransfers()->size(), 1u);
}

TEST(Limits, BuffersComeInPagesWalkedOnceInOrder) {
  Node n;
  ASSERT_TRUE(n.ok()) << (n.process ? n.process->Log() : "");
  constexpr int kBuffers = 2500;
  std::vector<std::string> made;
  for (int i = 0; i < kBuffers; ++i) {
    auto b = n.client->Allocate(4096);
    ASSERT_TRUE(b.ok()) << i << ": " << b.status();
    made.push_back(b->id());
  }

  // page_size 0: the most, 1000, and a token; the tokens walk every buffer once, oldest
  // first.
  std::vector<std::string> walked;
  std::vector<int> sizes;
  v1::ListBuffersRequest request;
  for (int page = 0; page < 10; ++page) {
    auto r = n.ListBuffers(request);
    ASSERT_TRUE(r.ok()) << r.status();
    sizes.push_back(r->buffers_size());
    for (const v1::Buffer& b : r->buffers()) walked.push_back(b.id());
    if (r->next_page_token().empty()) break;
    request.set_page_token(r->next_page_token());
  }
  EXPECT_EQ(sizes, (std::vector<int>{1000, 1000, 500}));
  EXPECT_EQ(walked, made);
  EXPECT_EQ(std::set<std::string>(walked.begin(), walked.end()).size(), made.size());

  // page_size 7: 7 a page, the next 7 after the token.
  v1::ListBuffersRequest seven;
  seven.set_page_size(7);
  auto first = n.ListBuffers(seven);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->buffers_size(), 7);
  ASSERT_FALSE(first->next_page_token().empty());
  for (int i = 0; i < 7; ++i) EXPECT_EQ(first->buffers(i).id(), made[i]);
  seven.set_page_token(first->next_page_token());
  auto second = n.ListBuffers(seven);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->buffers_size(), 7);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(second->buffers(i).id(), made[7 + i]);
  // More than the most is the most.
  v1::ListBuffersRequest many;
  many.set_page_size(1u << 30);
  auto capped = n.ListBuffers(many);
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_EQ(capped->buffers_size(), 1000);

  // Tokens this node did not make.
  for (const std::string& bad :
       {std::string("garbage"), std::string("!!!"), absl::WebSafeBase64Escape("p1.x.b-1"),
        absl::WebSafeBase64Escape("p2.1.b-1"), std::string(300, 'A')}) {
    v1::ListBuffersRequest r;
    r.set_page_token(bad);
    EXPECT_EQ(n.ListBuffers(r).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  v1::ListBuffersRequest too_long;
  too_long.set_page_token(std::string(2000, 'A'));
  ExpectRefused(n.ListBuffers(too_long).status(), "page_token");

  // Buffers released or made between pages neither repeat nor shift the rest.
  v1::ListBuffersRequest head;
  head.set_page_size(100);
  auto before = n.ListBuffers(head);
  ASSERT_TRUE(before.ok()) << before.status();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(n.client->Release(made[i]).ok());
  ASSERT_TRUE(n.client->Release(made[150]).ok());
  auto late = n.client->Allocate(4096);
  ASSERT_TRUE(late.ok()) << late.status();
  v1::ListBuffersRequest rest;
  rest.set_page_token(before->next_page_token());
  std::vector<std::string> after;
  for (int page = 0; page < 10; ++page) {
    auto r = n.ListBuffers(rest);
    ASSERT_TRUE(r.ok()) << r.status();
    for (const v1::Buffer& b : r->buffers()) after.push_back(b.id());
    if (r->next_page_token().empty()) break;
    rest.set_page_token(r->next_page_token());
  }
  std::vector<std::string> want(made.begin() + 100, made.end());
  want.erase(want.begin() + 50);  // made[150]
  want.push_back(late->id());
  EXPECT_EQ(after, want);

  // The client follows the pages itself.
  auto all = n.client->ListBuffers();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), kBuffers - 11 + 1u);
}

TEST(Limits, TransfersComeInPagesNewestFirst) {
  Node n;
  ASSERT_TRUE(n.ok()) << (n.process ? n.process->Log() : "");
  auto a = n.client->Allocate(4096), b = n.client->Allocate(4096);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<std::string> made;
  for (int i = 0; i < 5; ++i) {
    auto t = n.client->Move(Ref(a->id()), Ref(b->id()));
    ASSERT_TRUE(t.ok()) << t.status();
    made.push_back(t->id());
  }
  const std::vector<std::string> newest_first(made.rbegin(), made.rend());

  v1::ListTransfersRequest request;
  request.set_page_size(2);
  std::vector<std::string> walked;
  std::vector<int> sizes;
  for (int page = 0; page < 10; ++page) {
    auto r = n.ListTransfers(request);
    ASSERT_TRUE(r.ok()) << r.status();
    sizes.push_back(r->transfers_size());
    for (const v1::Transfer& t : r->transfers()) walked.push_back(t.id());
    if (r->next_page_token().empty()) break;
    request.set_page_token(r->next_page_token());
  }
  EXPECT_EQ(sizes, (std::vector<int>{2, 2, 1}));
  EXPECT_EQ(walked, newest_first);

  // The older `limit` still caps one answer; page_size takes its place when set.
  v1::ListTransfersRequest limited;
  limited.set_limit(3);
  auto three = n.ListTransfers(limited);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->transfers_size(), 3);
  limited.set_page_size(1);
  auto one = n.ListTransfers(limited);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->transfers_size(), 1);
  EXPECT_EQ(one->transfers(0).id(), made.back());

  v1::ListTransfersRequest bad;
  bad.set_page_token("garbage");
  EXPECT_EQ(n.ListTransfers(bad).status().code(), StatusCode::kInvalidArgument);

  auto all = n.client->ListTransfers();
  ASSERT_TRUE(all.ok()) << all.status();
  std::vector<std::string> ids;
  for (const v1::Transfer& t : *all) ids.push_back(t.id());
  EXPECT_EQ(ids, newest_first);
  auto newest_two = n.client->ListTransfers({}, 2);
  ASSERT_TRUE(newest_two.ok()) << newest_two.status();
  ASSERT_EQ(newest_two->size(), 2u);
  EXPECT_EQ((*newest_two)[0].id(), made[4]);
  EXPECT_EQ((*newest_two)[1].id(), made[3]);
}

TEST(Limits, PreparedListsComeInPagesOldestFirst) {
  Node n;
  ASSERT_TRUE(n.ok()) << (n.process ? n.process->Log() : "");
  std::vector<std::string> made;
  for (int i = 0; i < 5; ++i) {
    v1::Segment s;
    s.set_length(8 + i);
    auto list = n.client->PreparePieces({s}, {}, "", absl::StrCat("list ", i));
    ASSERT_TRUE(list.ok()) << list.status();
    made.push_back(list->id());
  }
  v1::ListPreparedPiecesRequest request;
  request.set_page_size(2);
  std::vector<std::string> walked;
  std::vector<int> sizes;
  for (int page = 0; page < 10; ++page) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    v1::ListPreparedPiecesResponse r;
    grpc::Status st = n.transfers->ListPreparedPieces(&context, request, &r);
    ASSERT_TRUE(st.ok()) << st.error_message();
    sizes.push_back(r.lists_size());
    for (const v1::PreparedPieces& l : r.lists()) walked.push_back(l.id());
    if (r.next_page_token().empty()) break;
    request.set_page_token(r.next_page_token());
  }
  EXPECT_EQ(sizes, (std::vector<int>{2, 2, 1}));
  EXPECT_EQ(walked, made);
  v1::Segment s;
  s.set_length(8);
  ExpectRefused(n.client->PreparePieces({s}, {}, "", std::string(257, 'p')).status(), "label");
  auto all = n.client->ListPreparedPieces();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), made.size());
}

}  // namespace
}  // namespace gpumove
