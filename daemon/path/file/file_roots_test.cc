#include "daemon/path/file/file_roots.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpumove {
namespace {

namespace fs = std::filesystem;
using absl::StatusCode;

// A root with a file in it, a sub-directory, and things beside the root to escape to.
class FileRootsTest : public ::testing::TestWithParam<Resolve> {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    base_ =
        fs::path(tmp != nullptr ? tmp : "/tmp") /
        ("roots-" + std::to_string(getpid()) + "-" + std::to_string(static_cast<int>(GetParam())));
    fs::remove_all(base_);
    root_ = base_ / "root";
    fs::create_directories(root_ / "sub");
    fs::create_directories(base_ / "outside");
    Write(root_ / "data.bin", std::string(10000, 'a'));
    Write(root_ / "sub" / "inner.bin", "inner");
    Write(base_ / "outside" / "secret", "secret");
    fs::create_symlink(base_ / "outside" / "secret", root_ / "link");
    fs::create_symlink("../outside", root_ / "dirlink");
    fs::create_symlink("sub", root_ / "sublink");  // Inside the root, still refused.
    fs::create_hard_link(base_ / "outside" / "secret", root_ / "hard");
    ASSERT_EQ(mkfifo((root_ / "fifo").c_str(), 0600), 0);
    fs::create_directories(base_ / "ro");
    Write(base_ / "ro" / "file", "read only");
    auto roots =
        FileRoots::Create(root_.string() + "," + (base_ / "ro").string() + ":ro", GetParam());
    if (!roots.ok() && GetParam() == Resolve::kOpenat2) GTEST_SKIP() << roots.status();
    ASSERT_TRUE(roots.ok()) << roots.status();
    roots_ = *std::move(roots);
  }
  void TearDown() override { fs::remove_all(base_); }

  static void Write(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }

  FileRequest Req(const std::string& path, uint64_t length = 100, bool writable = false) {
    FileRequest r;
    r.root = root_.string();
    r.path = path;
    r.length = length;
    r.writable = writable;
    return r;
  }
  StatusCode Code(const FileRequest& r) { return roots_->Open(r).status().code(); }

  fs::path base_, root_;
  std::unique_ptr<FileRoots> roots_;
};

TEST_P(FileRootsTest, OpensARegionBeneathItsRoot) {
  auto f = roots_->Open(Req("data.bin", 4096));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_GE((*f)->fd(), 0);
  EXPECT_EQ((*f)->length(), 4096u);
  EXPECT_FALSE((*f)->writable());
  EXPECT_EQ((*f)->path(), "data.bin");
  EXPECT_EQ((*f)->root(), root_.string());
  FileRequest in_sub = Req("sub/inner.bin", 5);
  EXPECT_TRUE(roots_->Open(in_sub).ok());
  // The only root need not be named: but here there are two.
  in_sub.root = "";
  EXPECT_EQ(Code(in_sub), StatusCode::kInvalidArgument);
}

TEST_P(FileRootsTest, RefusesEscapes) {
  EXPECT_EQ(Code(Req("../outside/secret", 6)), StatusCode::kPermissionDenied);
  EXPECT_EQ(Code(Req("sub/../../outside/secret", 6)), StatusCode::kPermissionDenied);
  EXPECT_EQ(Code(Req((base_ / "outside" / "secret").string(), 6)), StatusCode::kPermissionDenied);
  EXPECT_EQ(Code(Req("link", 6)), StatusCode::kPermissionDenied);
  EXPECT_EQ(Code(Req("dirlink/secret", 6)), StatusCode::kPermissionDenied);
  EXPECT_EQ(Code(Req("sublink/inner.bin", 5)), StatusCode::kPermissionDenied);
  EXPECT_EQ(Code(Req("hard", 6)), StatusCode::kPermissionDenied);
  EXPECT_EQ(Code(Req("fifo", 1)), StatusCode::kPermissionDenied);
  EXPECT_EQ(Code(Req("sub", 1)), StatusCode::kPermissionDenied);
  // Creating through a link is refused too, and makes nothing.
  FileRequest create = Req("dirlink/new", 10, true);
  create.create = true;
  EXPECT_EQ(Code(create), StatusCode::kPermissionDenied);
  EXPECT_FALSE(fs::exists(base_ / "outside" / "new"));
}

TEST_P(FileRootsTest, RefusesMalformedRequests) {
  EXPECT_EQ(Code(Req("", 1)), StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(Req(std::string(600, 'a'), 1)), StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(Req(std::string(300, 'a'), 1)), StatusCode::kInvalidArgument);  // Component.
  std::string deep;
  for (int i = 0; i < 40; ++i) deep += "d/";
  EXPECT_EQ(Code(Req(deep + "f", 1)), StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(Req("sub//inner.bin", 5)), StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(Req("./data.bin", 5)), StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(Req(std::string("data\0bin", 8), 5)), StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(Req("data.bin", 0)), StatusCode::kInvalidArgument);
  FileRequest huge = Req("data.bin", ~uint64_t{0});
  EXPECT_EQ(Code(huge), StatusCode::kInvalidArgument);
  huge.offset = 5;
  huge.length = ~uint64_t{0} - 2;
  EXPECT_EQ(Code(huge), StatusCode::kInvalidArgument);
  // Read-only past the end of the file; writable may grow it.
  FileRequest past = Req("data.bin", 10001);
  EXPECT_EQ(Code(past), StatusCode::kInvalidArgument);
  past.writable = true;
  EXPECT_EQ(Code(past), StatusCode::kOk);
  FileRequest create_ro = Req("new", 10);
  create_ro.create = true;
  EXPECT_EQ(Code(create_ro), StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(root_ / "new"));
}

TEST_P(FileRootsTest, RootsAndCreation) {
  EXPECT_EQ(Code(Req("missing", 1)), StatusCode::kNotFound);
  FileRequest other = Req("data.bin", 1);
  other.root = (base_ / "outside").string();
  EXPECT_EQ(Code(other), StatusCode::kNotFound);
  FileRequest ro;
  ro.root = (base_ / "ro").string();
  ro.path = "file";
  ro.length = 4;
  EXPECT_TRUE(roots_->Open(ro).ok());
  ro.writable = true;
  EXPECT_EQ(roots_->Open(ro).status().code(), StatusCode::kPermissionDenied);
  // Create: a new file of mode 0600; an existing one is used as it is.
  FileRequest c = Req("sub/made.bin", 8192, true);
  c.create = true;
  auto f = roots_->Open(c);
  ASSERT_TRUE(f.ok()) << f.status();
  struct stat st;
  ASSERT_EQ(stat((root_ / "sub" / "made.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TRUE(roots_->Open(c).ok());
  // No parent directory: not found, nothing made.
  c.path = "nodir/made.bin";
  EXPECT_EQ(Code(c), StatusCode::kNotFound);
  EXPECT_FALSE(fs::exists(root_ / "nodir"));
}

TEST(FileRootsCreate, ChecksTheSpec) {
  EXPECT_TRUE((*FileRoots::Create(""))->empty());
  EXPECT_FALSE(FileRoots::Create("relative/dir").ok());
  EXPECT_FALSE(FileRoots::Create("/no/such/dir/here").ok());
  EXPECT_FALSE(FileRoots::Create("/tmp,/tmp/").ok());
  FileRequest r;
  r.path = "x";
  r.length = 1;
  EXPECT_EQ((*FileRoots::Create(""))->Open(r).status().code(), StatusCode::kFailedPrecondition);
  auto one = FileRoots::Create("/tmp/:ro");
  ASSERT_TRUE(one.ok());
  EXPECT_THAT((*one)->Describe(), ::testing::ElementsAre("/tmp:ro"));
}

// A table of hostile paths: none opens, none is a crash, each is refused with a client
// error (never INTERNAL), and the root holds the same entries afterwards.
TEST_P(FileRootsTest, HostilePathTable) {
  const std::string hostile[] = {
      "..",
      "../",
      "/",
      "//",
      "/etc/passwd",
      "sub/..",
      "sub/../data.bin",
      "./",
      ".",
      "data.bin/",
      "data.bin/x",
      "link/",
      "dirlink",
      "dirlink/",
      "dirlink/../root/data.bin",
      "sub/./inner.bin",
      "fifo",
      "hard",
      "sublink",
      "sub/inner.bin/..",
      std::string("\0", 1),
      std::string("data.bin\0../x", 13),
      std::string(513, '/'),
      "proc/self/root/etc/passwd",
      "sub/../../root/data.bin",
  };
  size_t before = 0;
  for (auto it = fs::directory_iterator(root_); it != fs::directory_iterator(); ++it) ++before;
  for (const std::string& p : hostile) {
    for (bool writable : {false, true}) {
      FileRequest r = Req(p, 1, writable);
      r.create = writable;
      auto f = roots_->Open(r);
      EXPECT_FALSE(f.ok()) << "opened " << p;
      EXPECT_NE(f.status().code(), StatusCode::kInternal) << p << ": " << f.status();
    }
  }
  size_t after = 0;
  for (auto it = fs::directory_iterator(root_); it != fs::directory_iterator(); ++it) ++after;
  EXPECT_EQ(after, before);
  // A random byte soup of paths: refused or not found, never INTERNAL.
  uint32_t seed = 12345;
  const char alphabet[] = "./a\\\0b.";
  for (int i = 0; i < 2000; ++i) {
    std::string p;
    const int n = 1 + static_cast<int>((seed = seed * 1103515245 + 12345) >> 16) % 12;
    for (int k = 0; k < n; ++k) p += alphabet[((seed = seed * 1103515245 + 12345) >> 16) % 7];
    auto f = roots_->Open(Req(p, 1));
    EXPECT_NE(f.status().code(), StatusCode::kInternal) << p << ": " << f.status();
    if (f.ok()) EXPECT_EQ((*f)->root(), root_.string());
  }
}

INSTANTIATE_TEST_SUITE_P(Resolutions, FileRootsTest,
                         ::testing::Values(Resolve::kOpenat2, Resolve::kPerComponent));

}  // namespace
}  // namespace gpumove
