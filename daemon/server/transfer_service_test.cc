// TransferService in-process: the service over a real scheduler, registry and host
// engine, served by an in-process gRPC server and called through its stub (no daemon
// spawned). Moves land and are watched; other tenants see nothing; bad specs change
// nothing.
#include "daemon/server/transfer_service.h"

#include <cstring>
#include <memory>
#include <string>

#include "daemon/core/transfer_scheduler.h"
#include "daemon/path/local/local_engine.h"
#include "daemon/server/service_test_base.h"

namespace gpumove {
namespace {

using grpc::StatusCode;

constexpr char kTokens[] = R"(alice-token-0123456789,alice,team-a,user
bob-token-0123456789,bob,team-b,user
carol-token-0123456789,carol,team-a,user,normal
)";
constexpr char kAlice[] = "alice-token-0123456789";
constexpr char kCarol[] = "carol-token-0123456789";  // Capped at class normal.
constexpr char kBob[] = "bob-token-0123456789";

class TransferServiceTest : public ServiceTestBase {
 protected:
  void SetUp() override {
    SetUpNode(kTokens);
    engine_ = std::make_unique<LocalEngine>(gpu_.get());
    scheduler_ = std::make_unique<TransferScheduler>(
        SchedulerOptions(), registry_.get(), std::vector<Engine*>{engine_.get()},
        [](const Endpoint&, uint64_t) { return absl::StatusOr<uint64_t>(1); });
    service_ = std::make_unique<TransferServiceImpl>(auth_.get(), scheduler_.get(), nullptr, "n");
    service_->set_long_calls(calls_.get());
    service_->set_buffers(registry_.get());
    stub_ = Serve<v1::TransferService>(service_.get());
  }

  // A buffer of `owner` (a tenant) filled with `fill`.
  std::string Buffer(const std::string& owner, uint64_t size, char fill) {
    AllocateOptions o;
    o.size = size;
    o.owner = owner;
    auto b = registry_->Allocate(o);
    EXPECT_TRUE(b.ok()) << b.status();
    auto use = registry_->Acquire(owner, b->id, 0, size);
    std::memset(use->data(), fill, size);
    return b->id;
  }
  std::string Bytes(const std::string& owner, const std::string& id) {
    auto use = registry_->Acquire(owner, id, 0, 0);
    return std::string(static_cast<const char*>(use->data()), use->length());
  }
  static v1::SubmitRequest Move(const std::string& from, const std::string& to, uint64_t offset = 0,
                                uint64_t length = 0) {
    v1::SubmitRequest r;
    v1::TransferSpec* s = r.add_transfers();
    s->mutable_source()->set_buffer_id(from);
    s->mutable_source()->set_offset(offset);
    s->mutable_source()->set_length(length);
    s->mutable_destination()->set_buffer_id(to);
    s->set_checksum(true);
    r.set_wait(true);
    return r;
  }

  std::unique_ptr<LocalEngine> engine_;
  std::unique_ptr<TransferScheduler> scheduler_;
  std::unique_ptr<TransferServiceImpl> service_;
  std::unique_ptr<v1::TransferService::Stub> stub_;
};

TEST_F(TransferServiceTest, AMoveLandsAndIsWatchedByItsTenantOnly) {
  const std::string src = Buffer("team-a", 1 << 20, 's');
  const std::string dst = Buffer("team-a", 1 << 20, 'd');
  v1::SubmitResponse submitted;
  ASSERT_TRUE(stub_->Submit(As(kAlice).get(), Move(src, dst), &submitted).ok());
  ASSERT_EQ(submitted.transfers_size(), 1);
  const v1::Transfer& t = submitted.transfers(0);
  EXPECT_EQ(t.state(), v1::SUCCEEDED);
  EXPECT_EQ(t.length(), 1u << 20);
  EXPECT_EQ(Bytes("team-a", dst), std::string(1 << 20, 's'));
  // Its tenant watches it to its end; Bob finds no such transfer, whichever call he makes.
  v1::WatchRequest watch;
  watch.set_id(t.id());
  auto context = As(kAlice);
  auto events = stub_->Watch(context.get(), watch);
  v1::TransferEvent e;
  ASSERT_TRUE(events->Read(&e));
  EXPECT_EQ(e.transfer().state(), v1::SUCCEEDED);
  EXPECT_FALSE(events->Read(&e));  // Ended: nothing more to say.
  EXPECT_TRUE(events->Finish().ok());
  auto bobs = As(kBob);
  EXPECT_EQ(stub_->Watch(bobs.get(), watch)->Finish().error_code(), StatusCode::NOT_FOUND);
  v1::GetTransferRequest get;
  get.set_id(t.id());
  v1::Transfer got;
  EXPECT_EQ(stub_->Get(As(kBob).get(), get, &got).error_code(), StatusCode::NOT_FOUND);
  EXPECT_TRUE(stub_->Get(As(kAlice).get(), get, &got).ok());
  v1::CancelRequest cancel;
  cancel.set_id(t.id());
  v1::Transfer cancelled;
  EXPECT_EQ(stub_->Cancel(As(kBob).get(), cancel, &cancelled).error_code(), StatusCode::NOT_FOUND);
  v1::ListTransfersRequest list;
  v1::ListTransfersResponse listed;
  ASSERT_TRUE(stub_->List(As(kBob).get(), list, &listed).ok());
  EXPECT_EQ(listed.transfers_size(), 0);
  ASSERT_TRUE(stub_->List(As(kAlice).get(), list, &listed).ok());
  EXPECT_EQ(listed.transfers_size(), 1);
}

TEST_F(TransferServiceTest, MovesOverOtherTenantsBuffersOrBadRangesChangeNothing) {
  const std::string mine = Buffer("team-a", 4096, 'a');
  const std::string also = Buffer("team-a", 4096, 'b');
  const std::string bobs = Buffer("team-b", 4096, 'x');
  v1::SubmitResponse r;
  // Into Bob's buffer, or out of it: as if it did not exist.
  EXPECT_EQ(stub_->Submit(As(kAlice).get(), Move(mine, bobs), &r).error_code(),
            StatusCode::NOT_FOUND);
  EXPECT_EQ(stub_->Submit(As(kAlice).get(), Move(bobs, mine), &r).error_code(),
            StatusCode::NOT_FOUND);
  // Past the end, overlapping itself, an empty batch, no credentials.
  EXPECT_EQ(stub_->Submit(As(kAlice).get(), Move(mine, also, 4000, 200), &r).error_code(),
            StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(stub_->Submit(As(kAlice).get(), Move(mine, mine), &r).error_code(),
            StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(stub_->Submit(As(kAlice).get(), v1::SubmitRequest(), &r).error_code(),
            StatusCode::INVALID_ARGUMENT);
  grpc::ClientContext anonymous;
  EXPECT_EQ(stub_->Submit(&anonymous, Move(mine, also), &r).error_code(),
            StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Bytes("team-a", mine), std::string(4096, 'a'));
  EXPECT_EQ(Bytes("team-a", also), std::string(4096, 'b'));
  EXPECT_EQ(Bytes("team-b", bobs), std::string(4096, 'x'));
  EXPECT_EQ(scheduler_->active(), 0u);
  for (const std::string& id : {mine, also}) {
    EXPECT_EQ(registry_->Get("team-a", id)->active_uses, 0u);
  }
}

// A block list with an index past its buffer's end names the block (not the range
// around all the blocks), and moves nothing.
TEST_F(TransferServiceTest, ABlockPastTheEndIsNamed) {
  const std::string src = Buffer("team-a", 64 << 10, 's');
  const std::string dst = Buffer("team-a", 64 << 10, 'd');
  v1::SubmitRequest r;
  v1::TransferSpec* spec = r.add_transfers();
  spec->mutable_source()->set_buffer_id(src);
  spec->mutable_destination()->set_buffer_id(dst);
  v1::BlockList* blocks = spec->mutable_blocks();
  blocks->set_block_size(4096);
  for (uint64_t i : {0, 3, 5}) blocks->add_source_blocks(i);
  for (uint64_t i : {1, 2, 1000000}) blocks->add_destination_blocks(i);  // 16 blocks fit.
  r.set_wait(true);
  v1::SubmitResponse response;
  const grpc::Status st = stub_->Submit(As(kAlice).get(), r, &response);
  EXPECT_EQ(st.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("destination piece 2 (block 2 of a block list: 4096 bytes "
                                    "at offset 4096000000)"),
            std::string::npos)
      << st.error_message();
  EXPECT_EQ(Bytes("team-a", dst), std::string(64 << 10, 'd'));
  EXPECT_EQ(registry_->Get("team-a", src)->active_uses, 0u);
}

// A required transport class other than rdma or tcp is INVALID_ARGUMENT for the whole
// batch (nothing moves); a move within one host is not held to a valid one.
TEST_F(TransferServiceTest, RequiredTransportIsCheckedAndIgnoredWithinAHost) {
  const std::string src = Buffer("team-a", 4096, 's');
  const std::string dst = Buffer("team-a", 4096, 'd');
  for (const std::string& bad : {std::string("verbs"), std::string("RDMA"), std::string(100, 'x')}) {
    v1::SubmitRequest r = Move(src, dst);
    *r.add_transfers() = r.transfers(0);
    r.mutable_transfers(1)->set_require_transport(bad);
    v1::SubmitResponse out;
    grpc::Status st = stub_->Submit(As(kAlice).get(), r, &out);
    EXPECT_EQ(st.error_code(), StatusCode::INVALID_ARGUMENT) << bad;
    EXPECT_NE(st.error_message().find("transfer 1: require_transport must be rdma, tcp or empty"),
              std::string::npos)
        << st.error_message();
    EXPECT_LT(st.error_message().size(), 200u);
  }
  EXPECT_EQ(Bytes("team-a", dst), std::string(4096, 'd'));
  EXPECT_EQ(scheduler_->active(), 0u);
  v1::SubmitRequest r = Move(src, dst);
  r.mutable_transfers(0)->set_require_transport("rdma");
  r.set_wait(true);
  v1::SubmitResponse out;
  ASSERT_TRUE(stub_->Submit(As(kAlice).get(), r, &out).ok());
  EXPECT_EQ(out.transfers(0).state(), v1::SUCCEEDED) << out.transfers(0).error_message();
  EXPECT_EQ(Bytes("team-a", dst), std::string(4096, 's'));
}

// A move's class is kept and shown; one the API does not define is INVALID_ARGUMENT, one
// above the caller's cap PERMISSION_DENIED, and either refuses the whole batch.
TEST_F(TransferServiceTest, PrioritiesAreCheckedAgainstTheCapAndShown) {
  const std::string src = Buffer("team-a", 4096, 's');
  const std::string dst = Buffer("team-a", 4096, 'd');
  auto submit = [&](const char* token, std::vector<int> classes, v1::SubmitResponse* out) {
    v1::SubmitRequest r = Move(src, dst);
    for (size_t i = 1; i < classes.size(); ++i) *r.add_transfers() = r.transfers(0);
    for (size_t i = 0; i < classes.size(); ++i) {
      r.mutable_transfers(static_cast<int>(i))->set_priority(static_cast<v1::Priority>(classes[i]));
    }
    return stub_->Submit(As(token).get(), r, out);
  };
  v1::SubmitResponse r;
  // Refused: nothing moves.
  grpc::Status st = submit(kCarol, {v1::NORMAL, v1::LATENCY}, &r);
  EXPECT_EQ(st.error_code(), StatusCode::PERMISSION_DENIED);
  EXPECT_NE(st.error_message().find("transfer 1: \"carol\" may ask for classes up to normal, "
                                    "not latency"),
            std::string::npos)
      << st.error_message();
  st = submit(kAlice, {v1::BULK, 7}, &r);
  EXPECT_EQ(st.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("transfer 1: unknown priority 7"), std::string::npos)
      << st.error_message();
  EXPECT_EQ(submit(kCarol, {-1}, &r).error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Bytes("team-a", dst), std::string(4096, 'd'));
  EXPECT_EQ(scheduler_->active(), 0u);
  // Within the cap (unset is normal); no cap for Alice.
  ASSERT_TRUE(submit(kCarol, {v1::PRIORITY_UNSPECIFIED, v1::BULK}, &r).ok());
  EXPECT_EQ(r.transfers(0).priority(), v1::NORMAL);
  EXPECT_EQ(r.transfers(1).priority(), v1::BULK);
  EXPECT_EQ(r.transfers(1).waits_for(), 0u);  // Ended (waited for the first: same bytes).
  ASSERT_TRUE(submit(kAlice, {v1::LATENCY}, &r).ok());
  EXPECT_EQ(r.transfers(0).priority(), v1::LATENCY);
  EXPECT_EQ(Bytes("team-a", dst), std::string(4096, 's'));
  v1::GetTransferRequest get;
  get.set_id(r.transfers(0).id());
  v1::Transfer got;
  ASSERT_TRUE(stub_->Get(As(kAlice).get(), get, &got).ok());
  EXPECT_EQ(got.priority(), v1::LATENCY);
  v1::ListTransfersResponse listed;
  ASSERT_TRUE(stub_->List(As(kAlice).get(), v1::ListTransfersRequest(), &listed).ok());
  ASSERT_EQ(listed.transfers_size(), 3);
  EXPECT_EQ(listed.transfers(0).priority(), v1::LATENCY);  // Newest first.
}

TEST(TokenFileClasses, ACapIsAClassAndOnlyThat) {
  auto tokens = ParseTokenFile("a,p,t,user,bulk\nb,q,t,admin\n");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(tokens->at("a").max_priority, Priority::kBulk);
  EXPECT_EQ(tokens->at("b").max_priority, Priority::kLatency);  // No cap.
  for (const char* bad : {"a,p,t,user,urgent\n", "a,p,t,user,\n", "a,p,t,user,bulk,x\n"}) {
    EXPECT_EQ(ParseTokenFile(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace gpumove
