// FILE buffers through a real gpumoved (issue 53): registered under --file_roots, moved
// to and from host memory on path FILE_IO (io_uring, and pread/pwrite forced), bytes
// compared on disk and in memory; the flags checked at start.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/gpumove_client.h"
#include "gtest/gtest.h"
#include "tests/util/daemon_process.h"
#include "tests/util/random_bytes.h"

namespace gpumove {
namespace {

namespace fs = std::filesystem;
using ::absl::StatusCode;

fs::path TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  fs::path d = fs::path(tmp != nullptr ? tmp : "/tmp") / absl::StrCat(name, ".", getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string OnDisk(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

v1::RegisterFileRequest File(const std::string& path, uint64_t length, bool writable) {
  v1::RegisterFileRequest r;
  r.set_path(path);
  r.set_length(length);
  r.set_writable(writable);
  r.set_create(writable);
  return r;
}

TEST(Files, HostMemoryToAFileAndBackThroughTheDaemon) {
  for (const std::string mode : {"io_uring", "pread/pwrite"}) {
    SCOPED_TRACE(mode);
    const fs::path root = TestDir("files-root");
    std::vector<std::string> flags = {"--file_roots=" + root.string(), "--host_pool_size=64MiB",
                                      "--pinned_pool_size=16MiB"};
    if (mode != "io_uring") flags.push_back("--file_io_fallback");
    auto process = DaemonProcess::Start(flags);
    ASSERT_TRUE(process.ok()) << process.status();
    auto client = Client::Connect((*process)->address());
    ASSERT_TRUE(client.ok()) << client.status();
    Client& c = **client;

    const uint64_t size = (5 << 20) + 123;  // Several chunks, an unaligned tail.
    const std::string data = RandomBytes(size, 7);
    auto host = c.Allocate(size, v1::HOST);
    ASSERT_TRUE(host.ok()) << host.status();
    ASSERT_TRUE(c.Write(Ref(host->id()), data).ok());
    auto out = c.RegisterFile(File("out.bin", size, true));
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->kind(), v1::FILE);
    MoveOptions o;
    o.checksum = true;
    o.durable = true;
    auto w = c.Move(Ref(host->id()), Ref(out->id()), o);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->state(), v1::SUCCEEDED) << w->error_message();
    EXPECT_EQ(w->path(), v1::FILE_IO);
    EXPECT_TRUE(w->durable());
    EXPECT_EQ(w->transport().rfind(mode, 0), 0u) << w->transport();
    EXPECT_EQ(w->source_xxh3(), w->destination_xxh3());
    EXPECT_TRUE(OnDisk(root / "out.bin") == data);

    // Back from the file, registered again read-only, into other host memory.
    auto in = c.RegisterFile(File("out.bin", size, false));
    ASSERT_TRUE(in.ok()) << in.status();
    auto back = c.Allocate(size, v1::PINNED_HOST);
    ASSERT_TRUE(back.ok());
    o.durable = false;
    auto r = c.Move(Ref(in->id()), Ref(back->id()), o);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->state(), v1::SUCCEEDED) << r->error_message();
    EXPECT_EQ(r->path(), v1::FILE_IO);
    EXPECT_TRUE(*c.Read(Ref(back->id())) == data);

    // A read-only file is no destination; a file is not read as memory.
    EXPECT_EQ(c.Move(Ref(host->id()), Ref(in->id()), o).status().code(),
              StatusCode::kFailedPrecondition);
    EXPECT_EQ(c.Read(Ref(in->id())).status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(c.RegisterFile(File("../escape", 10, true)).status().code(),
              StatusCode::kPermissionDenied);
    EXPECT_FALSE(fs::exists(root.parent_path() / "escape"));

    auto info = c.GetInfo();
    ASSERT_TRUE(info.ok());
    std::map<v1::Path, const v1::PathInfo*> paths;
    for (const auto& p : info->paths()) paths[p.path()] = &p;
    ASSERT_TRUE(paths.count(v1::FILE_IO));
    EXPECT_TRUE(paths[v1::FILE_IO]->available());
    EXPECT_NE(paths[v1::FILE_IO]->reason().find(root.string()), std::string::npos)
        << paths[v1::FILE_IO]->reason();
    ASSERT_TRUE(c.Release(out->id()).ok());
    ASSERT_TRUE(c.Release(in->id()).ok());
    EXPECT_TRUE(fs::exists(root / "out.bin"));  // Releasing a file buffer keeps the file.
    fs::remove_all(root);
  }
}

TEST(Files, WithoutRootsRegistrationIsRefusedAndBadFlagsStopTheStart) {
  auto process = DaemonProcess::Start({"--host_pool_size=16MiB", "--pinned_pool_size=16MiB"});
  ASSERT_TRUE(process.ok()) << process.status();
  auto client = Client::Connect((*process)->address());
  ASSERT_TRUE(client.ok());
  EXPECT_EQ((*client)->RegisterFile(File("x", 1, false)).status().code(),
            StatusCode::kFailedPrecondition);
  for (const auto& [flag, said] : std::vector<std::pair<std::string, std::string>>{
           {"--file_roots=relative/dir", "--file_roots"},
           {"--file_roots=/no/such/directory/here", "--file_roots"},
           {"--file_io_queue_depth=0", "--file_io_queue_depth"}}) {
    auto d = DaemonProcess::Start({flag});
    ASSERT_FALSE(d.ok()) << flag;
    EXPECT_NE(d.status().message().find(said), std::string::npos) << d.status();
  }
}

}  // namespace
}  // namespace gpumove
