// Path FILE_IO in one process: the engine alone (chunks, O_DIRECT or not, cancel,
// durable, the forced fallback), and moves between host buffers and FILE buffers through
// the scheduler, which picks the file engine for them.
#include "daemon/path/file/file_engine.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "daemon/core/buffer_registry.h"
#include "daemon/core/transfer_scheduler.h"
#include "daemon/gpu/gpu.h"
#include "daemon/memory/pool.h"
#include "daemon/path/file/file_roots.h"
#include "daemon/path/local/local_engine.h"
#include "gtest/gtest.h"

namespace gpumove {
namespace {

namespace fs = std::filesystem;

std::string Pattern(uint64_t n, uint32_t seed) {
  std::string s(n, '\0');
  for (uint64_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    s[i] = static_cast<char>(seed >> 24);
  }
  return s;
}

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class Control : public MoveControl {
 public:
  bool cancelled() const override { return cancel_after_ != 0 && reports_ >= cancel_after_; }
  void Progress(uint64_t bytes) override {
    EXPECT_GE(bytes, last_);
    last_ = bytes;
    ++reports_;
  }
  void Carried(std::string what) override { carried_ = std::move(what); }
  bool durable() const override {
    ++durable_asked_;
    return durable_;
  }
  int cancel_after_ = 0;  // Progress reports before cancelled() says yes (0: never).
  int reports_ = 0;
  uint64_t last_ = 0;
  std::string carried_;
  bool durable_ = false;
  mutable int durable_asked_ = 0;
};

class FileEngineTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = fs::path(tmp != nullptr ? tmp : "/tmp") /
           ("files-" + std::to_string(getpid()) + (GetParam() ? "-plain" : "-uring"));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    roots_ = *FileRoots::Create(dir_.string());
    FileEngineOptions o;
    o.chunk = 64 << 10;  // Moves below are many chunks.
    o.queue_depth = 4;
    o.force_fallback = GetParam();
    engine_ = std::make_unique<FileEngine>(o);
    gpu_ = GpuRuntime::CreateHostOnly("test");
    PoolSizes sizes;
    sizes.host = 32 << 20;
    sizes.pinned = 0;
    pools_ = *PoolSet::Create(sizes, {}, gpu_.get());
    registry_ = std::make_unique<BufferRegistry>(pools_.get(), absl::ZeroDuration());
  }
  void TearDown() override {
    sched_.reset();
    fs::remove_all(dir_);
  }

  std::shared_ptr<const FileRegion> Open(const std::string& name, uint64_t offset, uint64_t length,
                                         bool writable, bool create = false) {
    FileRequest r;
    r.path = name;
    r.offset = offset;
    r.length = length;
    r.writable = writable;
    r.create = create;
    auto f = roots_->Open(r);
    EXPECT_TRUE(f.ok()) << f.status();
    return f.ok() ? *f : nullptr;
  }
  static Endpoint FileEnd(const std::shared_ptr<const FileRegion>& f) {
    Endpoint e{nullptr, MemoryKind::kFile};
    e.file = f.get();
    e.file_offset = f->offset();
    return e;
  }
  static Endpoint Memory(char* p) { return Endpoint{p, MemoryKind::kHost}; }

  // Through the scheduler, as the daemon runs it: LOCAL first, then FILE_IO.
  void StartScheduler() {
    SchedulerOptions options;
    options.node = "n1";
    engines_ = {&local_, engine_.get()};
    sched_ = std::make_unique<TransferScheduler>(
        options, registry_.get(), engines_,
        [](const Endpoint& e, uint64_t n) -> absl::StatusOr<uint64_t> {
          if (e.kind == MemoryKind::kFile) return HashFileRange(e, n);
          return XXH3_64bits(e.data, n);
        });
  }
  std::string HostBuffer(const std::string& bytes) {
    AllocateOptions o;
    o.size = bytes.size();
    o.owner = "me";
    BufferInfo b = *registry_->Allocate(o);
    std::memcpy(registry_->Acquire("me", b.id, 0, 0)->data(), bytes.data(), bytes.size());
    return b.id;
  }
  std::string FileBuffer(std::shared_ptr<const FileRegion> f) {
    FileBufferOptions o;
    o.file = std::move(f);
    o.owner = "me";
    auto b = registry_->AdoptFile(o);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? b->id : "";
  }
  absl::StatusOr<TransferSnapshot> Run(const std::string& src, const std::string& dst,
                                       bool durable = false, PathKind path = PathKind::kAuto) {
    TransferSpec s;
    s.source = {"", src, 0, 0};
    s.destination = {"", dst, 0, 0};
    s.checksum = true;
    s.durable = durable;
    s.path = path;
    auto r = sched_->Submit("me", {s}, "");
    if (!r.ok()) return r.status();
    return sched_->Wait("me", r->at(0).id, absl::Now() + absl::Seconds(30));
  }

  fs::path dir_;
  std::unique_ptr<FileRoots> roots_;
  std::unique_ptr<FileEngine> engine_;
  std::unique_ptr<GpuRuntime> gpu_;
  std::unique_ptr<PoolSet> pools_;
  std::unique_ptr<BufferRegistry> registry_;
  LocalEngine local_{nullptr};
  std::vector<Engine*> engines_;
  std::unique_ptr<TransferScheduler> sched_;
};

TEST_P(FileEngineTest, WritesAndReadsBackAlignedAndUnaligned) {
  EXPECT_EQ(engine_->uses_io_uring(), !GetParam()) << engine_->Describe();
  // (file offset, length, memory offset): aligned, an unaligned tail, unaligned starts.
  const struct {
    uint64_t offset, length, mem;
  } cases[] = {
      {0, 1 << 20, 0}, {4096, (1 << 20) + 123, 0}, {100, 300000, 0}, {0, 65536 * 3, 7}, {0, 1, 0}};
  int n = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(n);
    const std::string name = "f" + std::to_string(n++);
    auto f = Open(name, c.offset, c.length, /*writable=*/true, /*create=*/true);
    ASSERT_NE(f, nullptr);
    std::vector<char> mem(c.length + c.mem + 8192);
    char* aligned = reinterpret_cast<char*>(
        (reinterpret_cast<uintptr_t>(mem.data()) + 4095) / 4096 * 4096 + c.mem);
    const std::string bytes = Pattern(c.length, n);
    std::memcpy(aligned, bytes.data(), c.length);
    Control w;
    ASSERT_TRUE(engine_->Move(Memory(aligned), FileEnd(f), c.length, w).ok());
    EXPECT_EQ(w.last_, c.length);
    EXPECT_EQ(w.carried_.rfind(GetParam() ? "pread/pwrite " : "io_uring ", 0), 0u) << w.carried_;
    const bool direct = f->direct_fd() >= 0 && c.offset % 4096 == 0 && c.mem == 0;
    EXPECT_EQ(w.carried_.find("O_DIRECT") != std::string::npos, direct && c.length >= 4096)
        << w.carried_;
    const std::string on_disk = ReadFile(dir_ / name);
    ASSERT_EQ(on_disk.size(), c.offset + c.length);
    EXPECT_TRUE(on_disk.compare(c.offset, c.length, bytes) == 0);
    // And back, into other memory.
    std::memset(aligned, 0, c.length);
    Control r;
    ASSERT_TRUE(engine_->Move(FileEnd(f), Memory(aligned), c.length, r).ok());
    EXPECT_EQ(std::string(aligned, c.length), bytes);
    auto h = HashFileRange(FileEnd(f), c.length);
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(*h, XXH3_64bits(bytes.data(), bytes.size()));
  }
}

TEST_P(FileEngineTest, CancelStopsEarlyAndDurableSyncs) {
  const uint64_t length = 4 << 20;  // 64 chunks.
  auto f = Open("big", 0, length, true, true);
  ASSERT_NE(f, nullptr);
  std::string bytes = Pattern(length, 9);
  Control c;
  c.cancel_after_ = 2;
  EXPECT_EQ(engine_->Move(Memory(bytes.data()), FileEnd(f), length, c).code(),
            absl::StatusCode::kCancelled);
  EXPECT_LT(c.last_, length);
  EXPECT_LT(fs::file_size(dir_ / "big"), length);
  Control d;
  d.durable_ = true;
  ASSERT_TRUE(engine_->Move(Memory(bytes.data()), FileEnd(f), length, d).ok());
  EXPECT_GE(d.durable_asked_, 1);
  EXPECT_EQ(ReadFile(dir_ / "big"), bytes);
  // Reads are never synced.
  Control r;
  r.durable_ = true;
  ASSERT_TRUE(engine_->Move(FileEnd(f), Memory(bytes.data()), length, r).ok());
  EXPECT_EQ(r.durable_asked_, 0);
}

TEST_P(FileEngineTest, ATruncatedFileIsAClearError) {
  std::ofstream(dir_ / "short", std::ios::binary) << Pattern(1 << 20, 3);
  auto f = Open("short", 0, 1 << 20, false);
  ASSERT_NE(f, nullptr);
  fs::resize_file(dir_ / "short", 1000);
  std::string mem(1 << 20, '\0');
  Control c;
  absl::Status st = engine_->Move(FileEnd(f), Memory(mem.data()), 1 << 20, c);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("ended at byte"), std::string::npos) << st;
}

TEST_P(FileEngineTest, ServesOnlyHostMemoryAndFilesHere) {
  std::ofstream(dir_ / "ro") << "0123456789";
  auto ro = Open("ro", 0, 10, true);
  auto ro2 = Open("ro", 0, 10, false);
  ASSERT_NE(ro2, nullptr);
  char mem[16];
  EXPECT_TRUE(engine_->CanServe(Memory(mem), FileEnd(ro)).ok());
  EXPECT_FALSE(engine_->CanServe(Memory(mem), FileEnd(ro2)).ok());  // Read-only.
  EXPECT_TRUE(engine_->CanServe(FileEnd(ro2), Memory(mem)).ok());
  EXPECT_FALSE(engine_->CanServe(Memory(mem), Memory(mem)).ok());
  EXPECT_FALSE(engine_->CanServe(FileEnd(ro2), FileEnd(ro)).ok());
  Endpoint device{mem, MemoryKind::kDevice, 0};
  EXPECT_FALSE(engine_->CanServe(FileEnd(ro2), device).ok());
  RemoteHold hold;
  Endpoint remote{nullptr, MemoryKind::kHost, kHostDevice, &hold};
  EXPECT_FALSE(engine_->CanServe(FileEnd(ro2), remote).ok());
}

TEST_P(FileEngineTest, SchedulerPicksFileIoForFileBuffers) {
  StartScheduler();
  const std::string bytes = Pattern((3 << 20) + 77, 5);
  const std::string host = HostBuffer(bytes);
  const std::string file = FileBuffer(Open("sched", 0, bytes.size(), true, true));
  auto w = Run(host, file, /*durable=*/true);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->state, TransferState::kSucceeded) << w->status;
  EXPECT_EQ(w->path, PathKind::kFile);
  EXPECT_TRUE(w->durable);
  EXPECT_FALSE(w->carrier.empty());
  EXPECT_EQ(w->source_xxh3, w->destination_xxh3);
  EXPECT_EQ(ReadFile(dir_ / "sched"), bytes);
  // Back into a fresh host buffer.
  const std::string back = HostBuffer(std::string(bytes.size(), '\0'));
  auto r = Run(file, back);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state, TransferState::kSucceeded) << r->status;
  EXPECT_EQ(r->path, PathKind::kFile);
  auto use = registry_->Acquire("me", back, 0, 0);
  EXPECT_EQ(std::string(use->data(), use->length()), bytes);
  // Named paths: LOCAL cannot move a file, FILE_IO cannot move memory to memory.
  EXPECT_EQ(Run(file, back, false, PathKind::kLocal).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Run(host, back, false, PathKind::kFile).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A read-only file is no destination; a file buffer is no memory for other users.
  const std::string ro = FileBuffer(Open("sched", 0, bytes.size(), false));
  EXPECT_EQ(Run(host, ro).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_->Acquire("me", file, 0, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(registry_->Acquire("me", file, 0, 0, /*files=*/true).ok());
  // Released: its file is closed, the file stays.
  ASSERT_TRUE(registry_->Release("me", file).ok());
  EXPECT_TRUE(fs::exists(dir_ / "sched"));
}

INSTANTIATE_TEST_SUITE_P(Engines, FileEngineTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "pread" : "io_uring"; });

}  // namespace
}  // namespace gpumove
