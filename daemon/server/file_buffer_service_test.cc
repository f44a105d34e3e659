// BufferService.RegisterFile in-process, through a stub as a client calls it: FILE
// buffers under the node's roots, their codes for hostile requests, tenants and roles,
// and the other calls refusing them as memory.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "daemon/server/buffer_service.h"
#include "daemon/server/service_test_base.h"

namespace gpumove {
namespace {

namespace fs = std::filesystem;
using grpc::StatusCode;

constexpr char kTokens[] = R"(alice-token-0123456789,alice,team-a,user
rita-token-0123456789,rita,team-a,reader
bob-token-0123456789,bob,team-b,user
)";
constexpr char kAlice[] = "alice-token-0123456789";

class FileBufferServiceTest : public ServiceTestBase {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = fs::path(tmp != nullptr ? tmp : "/tmp") / ("filesvc-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    // With principals, a tenant's files are beneath <root>/<tenant>/.
    fs::create_directories(dir_ / "root" / "team-a");
    fs::create_directories(dir_ / "root" / "team-b");
    fs::create_directories(dir_ / "ro" / "team-a");
    std::ofstream(dir_ / "root" / "team-a" / "data") << std::string(8192, 'x');
    std::ofstream(dir_ / "root" / "team-b" / "theirs") << std::string(100, 'b');
    std::ofstream(dir_ / "ro" / "team-a" / "data") << std::string(100, 'y');
    std::ofstream(dir_ / "secret") << "secret";
    fs::create_symlink(dir_ / "secret", dir_ / "root" / "team-a" / "link");
    roots_ = *FileRoots::Create((dir_ / "root").string() + "," + (dir_ / "ro").string() + ":ro");
    SetUpNode(kTokens);
    service_ = std::make_unique<BufferServiceImpl>(auth_.get(), registry_.get(), gpu_.get(), "n");
    service_->set_long_calls(calls_.get());
    service_->set_file_roots(roots_.get());
    stub_ = Serve<v1::BufferService>(service_.get());
  }
  void TearDown() override {
    ServiceTestBase::TearDown();
    fs::remove_all(dir_);
  }

  v1::RegisterFileRequest Req(const std::string& path, uint64_t length, bool writable = false) {
    v1::RegisterFileRequest r;
    r.set_root((dir_ / "root").string());
    r.set_path(path);
    r.set_length(length);
    r.set_writable(writable);
    return r;
  }
  grpc::Status Register(const v1::RegisterFileRequest& r, v1::Buffer* out = nullptr,
                        const std::string& token = kAlice) {
    v1::Buffer ignored;
    return stub_->RegisterFile(As(token).get(), r, out != nullptr ? out : &ignored);
  }
  size_t Buffers() { return registry_->List(kAnyOwner).size(); }

  fs::path dir_;
  std::unique_ptr<FileRoots> roots_;
  std::unique_ptr<BufferServiceImpl> service_;
  std::unique_ptr<v1::BufferService::Stub> stub_;
};

TEST_F(FileBufferServiceTest, RegistersAFileRegionAsABuffer) {
  v1::RegisterFileRequest r = Req("data", 4096);
  r.set_offset(4096);
  r.set_label("weights");
  r.mutable_lease_ttl()->set_seconds(60);
  v1::Buffer b;
  ASSERT_TRUE(Register(r, &b).ok());
  EXPECT_EQ(b.kind(), v1::FILE);
  EXPECT_EQ(b.size(), 4096u);
  EXPECT_EQ(b.owner(), "team-a");
  EXPECT_EQ(b.label(), "weights");
  EXPECT_TRUE(b.has_lease_expire_time());
  EXPECT_EQ(b.file_path(), "team-a/data");  // Beneath its tenant's directory.
  EXPECT_EQ(b.file_root(), (dir_ / "root").string());
  EXPECT_EQ(b.file_offset(), 4096u);
  EXPECT_FALSE(b.file_writable());
  // Its tenant sees it; another does not.
  v1::GetBufferRequest get;
  get.set_buffer_id(b.id());
  v1::Buffer got;
  EXPECT_TRUE(stub_->Get(As(kAlice).get(), get, &got).ok());
  EXPECT_EQ(stub_->Get(As("bob-token-0123456789").get(), get, &got).error_code(),
            StatusCode::NOT_FOUND);
  // A file is no memory to stream or export.
  v1::ReadRequest read;
  read.mutable_source()->set_buffer_id(b.id());
  auto context = As(kAlice);  // Outlives the stream.
  auto reader = stub_->Read(context.get(), read);
  v1::ReadResponse m;
  while (reader->Read(&m)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), StatusCode::FAILED_PRECONDITION);
  // Created writable, under a writable root.
  v1::RegisterFileRequest c = Req("new.bin", 1 << 20, true);
  c.set_create(true);
  ASSERT_TRUE(Register(c, &b).ok());
  EXPECT_TRUE(b.file_writable());
  EXPECT_TRUE(fs::exists(dir_ / "root" / "team-a" / "new.bin"));
}

// A tenant's paths resolve beneath <root>/<tenant>/: another tenant's file is not there
// (NOT_FOUND), climbing out of the tenant's directory is refused, and nothing is created
// outside it.
TEST_F(FileBufferServiceTest, ATenantReachesOnlyItsOwnDirectory) {
  constexpr char kBob[] = "bob-token-0123456789";
  EXPECT_TRUE(Register(Req("theirs", 100), nullptr, kBob).ok());
  EXPECT_EQ(Register(Req("theirs", 100)).error_code(), StatusCode::NOT_FOUND);  // Alice.
  EXPECT_EQ(Register(Req("../team-b/theirs", 100)).error_code(), StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Register(Req("data", 100), nullptr, kBob).error_code(), StatusCode::NOT_FOUND);
  v1::RegisterFileRequest c = Req("made.bin", 4096, true);
  c.set_create(true);
  ASSERT_TRUE(Register(c, nullptr, kBob).ok());
  EXPECT_TRUE(fs::exists(dir_ / "root" / "team-b" / "made.bin"));
  EXPECT_FALSE(fs::exists(dir_ / "root" / "made.bin"));
  EXPECT_FALSE(fs::exists(dir_ / "root" / "team-a" / "made.bin"));
}

TEST_F(FileBufferServiceTest, RefusalsHaveTheirCodesAndChangeNothing) {
  const struct {
    v1::RegisterFileRequest request;
    const char* token;
    StatusCode code;
  } cases[] = {
      {Req("../secret", 6), kAlice, StatusCode::PERMISSION_DENIED},
      {Req((dir_ / "secret").string(), 6), kAlice, StatusCode::PERMISSION_DENIED},
      {Req("link", 6), kAlice, StatusCode::PERMISSION_DENIED},
      {Req("data", 10), "rita-token-0123456789", StatusCode::PERMISSION_DENIED},  // A reader.
      {Req("data", 10), "no-such-token-0000000", StatusCode::UNAUTHENTICATED},
      {Req("missing", 10), kAlice, StatusCode::NOT_FOUND},
      {Req("data", 0), kAlice, StatusCode::INVALID_ARGUMENT},
      {Req("data", 8193), kAlice, StatusCode::INVALID_ARGUMENT},  // Read-only past the end.
      {Req("", 1), kAlice, StatusCode::INVALID_ARGUMENT},
      {Req(std::string(600, 'a'), 1), kAlice, StatusCode::INVALID_ARGUMENT},
      {Req(std::string(2000, 'a'), 1), kAlice, StatusCode::INVALID_ARGUMENT},  // Field bound.
  };
  for (const auto& c : cases) {
    EXPECT_EQ(Register(c.request, nullptr, c.token).error_code(), c.code) << c.request.path();
  }
  v1::RegisterFileRequest ro;
  ro.set_root((dir_ / "ro").string());
  ro.set_path("data");
  ro.set_length(10);
  EXPECT_TRUE(Register(ro).ok());
  ro.set_writable(true);
  EXPECT_EQ(Register(ro).error_code(), StatusCode::PERMISSION_DENIED);
  v1::RegisterFileRequest unknown_root = Req("data", 10);
  unknown_root.set_root("/etc");
  EXPECT_EQ(Register(unknown_root).error_code(), StatusCode::NOT_FOUND);
  v1::RegisterFileRequest negative = Req("made", 10, true);
  negative.set_create(true);
  negative.mutable_lease_ttl()->set_seconds(-5);
  EXPECT_EQ(Register(negative).error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(fs::exists(dir_ / "root" / "team-a" / "made"));  // Nothing created on error.
  EXPECT_EQ(Buffers(), 1u);                          // Only the read-only one above.
  // No roots: FAILED_PRECONDITION.
  service_->set_file_roots(nullptr);
  EXPECT_EQ(Register(Req("data", 10)).error_code(), StatusCode::FAILED_PRECONDITION);
}

}  // namespace
}  // namespace gpumove
