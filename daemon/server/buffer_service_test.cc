// BufferService in-process: the service over a real registry and authenticator, served by
// an in-process gRPC server and called through its stub, as a client would (no daemon
// spawned). Tenants, credentials, bounds and the byte streams.
#include "daemon/server/buffer_service.h"

#include <memory>
#include <string>

#include "daemon/server/service_test_base.h"

namespace gpumove {
namespace {

using grpc::StatusCode;

constexpr char kTokens[] = R"(alice-token-0123456789,alice,team-a,user
rita-token-0123456789,rita,team-a,reader
bob-token-0123456789,bob,team-b,user
)";

class BufferServiceTest : public ServiceTestBase {
 protected:
  void SetUp() override {
    SetUpNode(kTokens);
    service_ = std::make_unique<BufferServiceImpl>(auth_.get(), registry_.get(), gpu_.get(), "n");
    service_->set_long_calls(calls_.get());
    stub_ = Serve<v1::BufferService>(service_.get());
  }

  grpc::Status Allocate(const std::string& token, uint64_t size, v1::Buffer* out) {
    v1::AllocateRequest r;
    r.set_size(size);
    return stub_->Allocate(As(token).get(), r, out);
  }
  grpc::Status Write(const std::string& token, const v1::BufferRef& target, const std::string& data,
                     v1::WriteResponse* out) {
    auto context = As(token);
    auto writer = stub_->Write(context.get(), out);
    v1::WriteRequest first;
    *first.mutable_target() = target;
    first.set_data(data);
    writer->Write(first);
    writer->WritesDone();
    return writer->Finish();
  }
  grpc::Status Read(const std::string& token, const v1::BufferRef& source, std::string* data,
                    uint32_t chunk = 0) {
    auto context = As(token);
    v1::ReadRequest r;
    *r.mutable_source() = source;
    r.set_chunk_size(chunk);
    auto reader = stub_->Read(context.get(), r);
    v1::ReadResponse m;
    while (reader->Read(&m)) {
      EXPECT_EQ(m.offset(), source.offset() + data->size());  // In the buffer, in order.
      data->append(m.data());
    }
    return reader->Finish();
  }
  static v1::BufferRef Ref(const std::string& id, uint64_t offset = 0, uint64_t length = 0) {
    v1::BufferRef r;
    r.set_buffer_id(id);
    r.set_offset(offset);
    r.set_length(length);
    return r;
  }

  std::unique_ptr<BufferServiceImpl> service_;
  std::unique_ptr<v1::BufferService::Stub> stub_;
};

TEST_F(BufferServiceTest, BytesWrittenAreReadBackByTheirTenantOnly) {
  v1::Buffer b;
  ASSERT_TRUE(Allocate("alice-token-0123456789", 1 << 20, &b).ok());
  EXPECT_EQ(b.size(), 1u << 20);
  EXPECT_EQ(b.node(), "n");
  std::string data(300000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 3);
  v1::WriteResponse written;
  ASSERT_TRUE(Write("alice-token-0123456789", Ref(b.id(), 4096, data.size()), data, &written).ok());
  EXPECT_EQ(written.bytes_written(), data.size());
  // Rita (a reader of team-a) reads it back in small chunks; every offset in order.
  std::string back;
  ASSERT_TRUE(Read("rita-token-0123456789", Ref(b.id(), 4096, data.size()), &back, 65536).ok());
  EXPECT_EQ(back, data);
  // Bob (team-b) finds nothing: not his, not even there.
  std::string none;
  EXPECT_EQ(Read("bob-token-0123456789", Ref(b.id()), &none).error_code(), StatusCode::NOT_FOUND);
  EXPECT_EQ(Write("bob-token-0123456789", Ref(b.id()), "x", &written).error_code(),
            StatusCode::NOT_FOUND);
  v1::ReleaseRequest release;
  release.set_buffer_id(b.id());
  v1::ReleaseResponse released;
  EXPECT_EQ(stub_->Release(As("bob-token-0123456789").get(), release, &released).error_code(),
            StatusCode::NOT_FOUND);
  // A reader may not release; its owner may, once.
  EXPECT_EQ(stub_->Release(As("rita-token-0123456789").get(), release, &released).error_code(),
            StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(stub_->Release(As("alice-token-0123456789").get(), release, &released).ok());
  EXPECT_EQ(stub_->Release(As("alice-token-0123456789").get(), release, &released).error_code(),
            StatusCode::NOT_FOUND);
}

TEST_F(BufferServiceTest, CallersWithoutCredentialsGetNothing) {
  v1::Buffer b;
  EXPECT_EQ(Allocate("", 4096, &b).error_code(), StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Allocate("not-a-token", 4096, &b).error_code(), StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Allocate("rita-token-0123456789", 4096, &b).error_code(),
            StatusCode::PERMISSION_DENIED);
  v1::ListBuffersRequest list;
  v1::ListBuffersResponse listed;
  EXPECT_EQ(stub_->List(As("").get(), list, &listed).error_code(), StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(registry_->List("team-a").size(), 0u);  // Nothing was made.
}

TEST_F(BufferServiceTest, BadRequestsGetTheirCodesAndChangeNothing) {
  const std::string alice = "alice-token-0123456789";
  v1::Buffer b;
  EXPECT_EQ(Allocate(alice, 0, &b).error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Allocate(alice, 1ull << 40, &b).error_code(), StatusCode::INVALID_ARGUMENT);  // > pool.
  v1::Buffer most;
  ASSERT_TRUE(Allocate(alice, 12 << 20, &most).ok());
  EXPECT_EQ(Allocate(alice, 8 << 20, &b).error_code(), StatusCode::RESOURCE_EXHAUSTED);  // Full.
  v1::ReleaseRequest release;
  release.set_buffer_id(most.id());
  v1::ReleaseResponse released;
  ASSERT_TRUE(stub_->Release(As(alice).get(), release, &released).ok());
  v1::AllocateRequest long_label;
  long_label.set_size(4096);
  long_label.set_label(std::string(10000, 'l'));
  EXPECT_EQ(stub_->Allocate(As(alice).get(), long_label, &b).error_code(),
            StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(registry_->List("team-a").size(), 0u);
  ASSERT_TRUE(Allocate(alice, 8192, &b).ok());
  v1::WriteResponse written;
  // Past the end, and an offset that wraps: refused before a byte is written.
  EXPECT_EQ(Write(alice, Ref(b.id(), 8000, 500), std::string(500, 'x'), &written).error_code(),
            StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Write(alice, Ref(b.id(), 0, 100), std::string(500, 'x'), &written).error_code(),
            StatusCode::INVALID_ARGUMENT);  // More than the stream said it carries.
  EXPECT_NE(Write(alice, Ref(b.id(), UINT64_MAX - 10), "xy", &written).error_code(),
            StatusCode::OK);
  std::string back;
  ASSERT_TRUE(Read(alice, Ref(b.id()), &back).ok());
  EXPECT_EQ(back, std::string(8192, '\0'));
  back.clear();
  EXPECT_EQ(Read(alice, Ref(b.id()), &back, 64 << 20).error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Read(alice, Ref("b-nope"), &back).error_code(), StatusCode::NOT_FOUND);
  EXPECT_EQ(registry_->Get("team-a", b.id())->active_uses, 0u);
}

}  // namespace
}  // namespace gpumove
