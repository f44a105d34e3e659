// GPU suite for CUDA IPC and the MPI staging path (tag "gpu"; run on the GPU machine):
// client memory imported into a daemon and moved, bad handles, a daemon buffer exported
// and written by the client, a client that exits while its memory is lent, path
// CUDA_IPC between two daemons on one host (one per GPU), cancel, and path MPI moving
// device buffers through the staging pipeline of a host-only MPI.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/gpumove_client.h"
#include "daemon/gpu/gpu.h"
#include "gtest/gtest.h"
#include "proto/gpumove/peer/v1/peer.grpc.pb.h"
#include "tests/util/daemon_process.h"
#include "tests/util/peer_calls.h"
#include "tests/util/mpi_job.h"
#include "tests/util/pieces.h"
#include "tests/util/random_bytes.h"

#ifdef GPUMOVE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace gpumove {
namespace {

#ifdef GPUMOVE_HAVE_CUDA

v1::BufferRef On(const std::string& node, const std::string& id, uint64_t offset = 0,
                 uint64_t length = 0) {
  v1::BufferRef r = Ref(id, offset, length);
  r.set_node(node);
  return r;
}

std::string Uuid(int device) {
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, device);
  return FormatGpuUuid(prop.uuid.bytes);
}

int GpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

// A cudaMalloc allocation of this test process, filled with `data`.
struct ClientMemory {
  void* ptr = nullptr;
  std::string handle;
  ClientMemory(int device, const std::string& data) {
    cudaSetDevice(device);
    EXPECT_EQ(cudaMalloc(&ptr, data.size()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, data.data(), data.size(), cudaMemcpyHostToDevice), cudaSuccess);
    cudaIpcMemHandle_t h;
    EXPECT_EQ(cudaIpcGetMemHandle(&h, ptr), cudaSuccess);
    handle.assign(h.reserved, sizeof(h.reserved));
  }
  ~ClientMemory() { cudaFree(ptr); }
  std::string Contents(size_t offset, size_t n) const {
    std::string out(n, '\0');
    cudaMemcpy(out.data(), static_cast<char*>(ptr) + offset, n, cudaMemcpyDeviceToHost);
    return out;
  }
};

class GpuIpc : public ::testing::Test {
 protected:
  void SetUp() override {
    if (GpuCount() == 0) GTEST_SKIP() << "no GPU";
    auto d = DaemonProcess::Start({"--node=ipc-a", "--device_pool_size=1GiB",
                                   "--host_pool_size=512MiB", "--pinned_pool_size=128MiB"});
    ASSERT_TRUE(d.ok()) << d.status();
    d_ = *std::move(d);
    c_ = *Client::Connect(d_->address());
  }
  std::unique_ptr<DaemonProcess> d_;
  std::unique_ptr<Client> c_;
};

TEST_F(GpuIpc, ImportedClientMemoryMovesBothWaysAndIsLetGo) {
  const size_t alloc = (48 << 20) + 4096 + 5;
  const std::string data = RandomBytes(alloc, 1);
  for (int g = 0; g < GpuCount(); ++g) {
    SCOPED_TRACE(absl::StrCat("GPU ", g));
    ClientMemory mem(g, data);
    v1::ImportRequest req;
    req.set_cuda_ipc_handle(mem.handle);
    req.set_offset(4096);
    req.set_size(alloc - 4096);
    req.set_device_uuid(Uuid(g));
    req.set_owner_pid(getpid());
    req.set_label("mine");
    auto b = c_->Import(req);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(b->imported());
    EXPECT_EQ(b->kind(), v1::DEVICE);
    EXPECT_EQ(b->device(), g);
    EXPECT_EQ(b->size(), alloc - 4096);
    // Out of the client's memory into a host buffer, verified.
    auto host = c_->Allocate(alloc - 4096, v1::PINNED_HOST);
    MoveOptions o;
    o.checksum = true;
    auto out = c_->Move(Ref(b->id()), Ref(host->id()), o);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->state(), v1::SUCCEEDED) << out->error_message();
    EXPECT_TRUE(*c_->Read(Ref(host->id())) == data.substr(4096));
    // Into it, from another GPU's pool buffer: the client sees the bytes in its memory.
    const std::string fresh = RandomBytes(1 << 20, 2);
    auto dev = c_->Allocate(1 << 20, v1::DEVICE, GpuCount() - 1 - g);
    ASSERT_TRUE(c_->Write(Ref(dev->id()), fresh).ok());
    auto in = c_->Move(Ref(dev->id()), Ref(b->id(), 1000), o);
    ASSERT_TRUE(in.ok()) << in.status();
    ASSERT_EQ(in->state(), v1::SUCCEEDED) << in->error_message();
    EXPECT_TRUE(mem.Contents(4096 + 1000, 1 << 20) == fresh);
    EXPECT_TRUE(mem.Contents(4096, 1000) == data.substr(4096, 1000));  // Neighbours kept.
    // Released: gone; the same allocation can be lent again.
    ASSERT_TRUE(c_->Release(b->id()).ok());
    EXPECT_EQ(c_->GetBuffer(b->id()).status().code(), absl::StatusCode::kNotFound);
    auto again = c_->Import(req);
    ASSERT_TRUE(again.ok()) << again.status();
    ASSERT_TRUE(c_->Release(again->id()).ok());
    ASSERT_TRUE(c_->Release(host->id()).ok());
    ASSERT_TRUE(c_->Release(dev->id()).ok());
  }
}

TEST_F(GpuIpc, BadImportsGetInvalidArgumentAndChangeNothing) {
  ClientMemory mem(0, RandomBytes(1 << 20, 3));
  v1::ImportRequest good;
  good.set_cuda_ipc_handle(mem.handle);
  good.set_size(1 << 20);
  good.set_device_uuid(Uuid(0));
  auto code = [&](v1::ImportRequest r) { return c_->Import(r).status().code(); };
  v1::ImportRequest r = good;
  r.set_cuda_ipc_handle(std::string(64, '\x5a'));  // Garbage handle.
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.set_cuda_ipc_handle("short");
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.set_offset(4096);  // Runs past the allocation.
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.set_device_uuid("GPU-00000000-0000-0000-0000-000000000000");
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.set_size(0);
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.set_owner_pid(999999999);
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(c_->ListBuffers()->empty());
  EXPECT_TRUE(c_->GetInfo().ok());  // Still serving.
}

TEST_F(GpuIpc, ExportedBufferIsWrittenByTheClientDirectly) {
  const int g = GpuCount() - 1;
  v1::AllocateRequest request;
  request.set_size((8 << 20) + 3);
  request.set_kind(v1::DEVICE);
  request.set_device(g);
  request.set_exportable(true);
  auto b = c_->Allocate(request);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->exportable());
  auto ex = c_->Export(b->id());
  ASSERT_TRUE(ex.ok()) << ex.status();
  EXPECT_EQ(ex->size(), (8u << 20) + 3);
  EXPECT_EQ(ex->device_uuid(), Uuid(g));
  // The handle opens this buffer's own allocation (whole 2 MiB granules), zeroed, and no
  // pool: the driver says how big the mapping is.
  auto runtime = GpuRuntime::Create();
  auto mapped = runtime->IpcOpen(g, ex->cuda_ipc_handle());
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(ex->offset(), 0u);
  EXPECT_EQ(mapped->size, uint64_t{10} << 20);
  std::string all(mapped->size, 'x');
  ASSERT_EQ(cudaMemcpy(all.data(), mapped->base, all.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(all, std::string(all.size(), '\0'));
  const std::string data = RandomBytes(ex->size(), 4);
  ASSERT_EQ(cudaMemcpy(mapped->base + ex->offset(), data.data(), data.size(),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  EXPECT_TRUE(*c_->Read(Ref(b->id())) == data);
  // And it moves like any device buffer (staged where UCX needs pool memory).
  auto host = c_->Allocate(data.size());
  ASSERT_TRUE(host.ok());
  auto moved = c_->Move(Ref(b->id()), Ref(host->id()));
  ASSERT_TRUE(moved.ok()) << moved.status();
  ASSERT_EQ(moved->state(), v1::SUCCEEDED) << moved->error_message();
  EXPECT_TRUE(*c_->Read(Ref(host->id())) == data);
  runtime->IpcClose(g, mapped->base);
  EXPECT_EQ(c_->Export(host->id()).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c_->Export("b-nope").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(c_->Release(b->id()).ok());
}

// A device pool holds every tenant's buffers: its handle never goes to a client.
TEST_F(GpuIpc, APoolBufferIsNotExported) {
  const int g = GpuCount() - 1;
  auto b = c_->Allocate(4 << 20, v1::DEVICE, g);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(b->exportable());
  auto ex = c_->Export(b->id());
  EXPECT_EQ(ex.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(ex.status().message(), "exportable")) << ex.status();
  v1::AllocateRequest request;
  request.set_size(4096);
  request.set_exportable(true);  // HOST memory cannot be.
  EXPECT_EQ(c_->Allocate(request).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(GpuIpc, AClientThatExitsTakesItsLentMemoryWithIt) {
  const std::string helper = FindBuiltBinary("tests/gpu_ipc_client", "GPU_IPC_CLIENT");
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t child = fork();
  if (child == 0) {
    dup2(out[1], 1);
    execl(helper.c_str(), helper.c_str(), d_->address().c_str(), "4194304", "7", nullptr);
    _exit(127);
  }
  close(out[1]);
  char line[64] = {};
  FILE* f = fdopen(out[0], "r");
  ASSERT_NE(fgets(line, sizeof(line), f), nullptr) << "helper " << helper << " printed nothing";
  std::string id(line);
  id.erase(id.find_last_not_of("\n") + 1);
  auto b = c_->GetBuffer(id);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->owner_pid(), child);
  EXPECT_TRUE(*c_->Read(Ref(id, 0, 16)) == std::string(16, '\x07'));
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  fclose(f);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (c_->GetBuffer(id).ok() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(c_->GetBuffer(id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(c_->GetInfo().ok());
}

// Two daemons on one host, one GPU each (the same GPU when there is only one).
class GpuIpcTwoDaemons : public ::testing::Test {
 protected:
  void SetUp() override {
    if (GpuCount() == 0) GTEST_SKIP() << "no GPU";
    other_ = GpuCount() > 1 ? 1 : 0;
    const std::string other = absl::StrCat(other_);
    auto a = DaemonProcess::Start({"--node=ipc-a", "--gpus=0", "--device_pool_size=1536MiB",
                                   "--host_pool_size=256MiB", "--max_move_rate=0",
                                   "--nocuda_ipc_fences"});
    ASSERT_TRUE(a.ok()) << a.status();
    a_ = *std::move(a);
    // ipc-b offers fences (ipc-a does not): moves onto or out of b's ranges end behind
    // one that b waits for, those onto or out of a's wait for their copy where they run.
    auto b = DaemonProcess::Start({"--node=ipc-b", "--gpus=" + other, "--device_pool_size=1536MiB",
                                   "--host_pool_size=256MiB", "--v=2",
                                   "--peers=" + a_->address()});
    ASSERT_TRUE(b.ok()) << b.status();
    b_ = *std::move(b);
    ca_ = *Client::Connect(a_->address());
    cb_ = *Client::Connect(b_->address());
    for (int i = 0; i < 200 && ca_->ListPeers()->empty(); ++i) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    ASSERT_EQ(ca_->ListPeers()->size(), 1u);
  }
  // ipc-a pushes its range `src` into ipc-b's buffer `far` (as long) and pulls that back
  // into its range `back`.
  void PushAndPullBack(const v1::BufferRef& src, const std::string& far,
                       const v1::BufferRef& back, const MoveOptions& o) {
    auto push = ca_->Move(src, On("ipc-b", far), o);
    ASSERT_TRUE(push.ok()) << push.status();
    ASSERT_EQ(push->state(), v1::SUCCEEDED) << push->error_message();
    auto pull = ca_->Move(On("ipc-b", far), back, o);
    ASSERT_TRUE(pull.ok()) << pull.status();
    ASSERT_EQ(pull->state(), v1::SUCCEEDED) << pull->error_message();
  }

  std::unique_ptr<DaemonProcess> a_, b_;
  std::unique_ptr<Client> ca_, cb_;
  int other_ = 0;
};

TEST_F(GpuIpcTwoDaemons, DeviceToDeviceOverCudaIpcEveryWayVerified) {
  uint64_t seed = 10;
  int k = 0;
  for (uint64_t size : {1ull, 4097ull, (3ull << 20) + 5, 96ull << 20}) {
    for (bool a_to_b : {true, false}) {
      Client& from = a_to_b ? *ca_ : *cb_;
      Client& to = a_to_b ? *cb_ : *ca_;
      const std::string from_node = a_to_b ? "ipc-a" : "ipc-b";
      const std::string to_node = a_to_b ? "ipc-b" : "ipc-a";
      Client& submit = (k++ % 2) ? from : to;  // Push, then pull.
      SCOPED_TRACE(absl::StrCat(from_node, " -> ", to_node, ", ", size, " bytes"));
      // Devices keep their CUDA index: ipc-b's GPU is `other_`.
      auto src = from.Allocate(size + 8, v1::DEVICE, a_to_b ? 0 : other_);
      auto dst = to.Allocate(size + 8, v1::DEVICE, a_to_b ? other_ : 0);
      ASSERT_TRUE(src.ok() && dst.ok()) << src.status() << dst.status();
      const std::string data = RandomBytes(size + 8, seed++);
      const std::string before = RandomBytes(size + 8, seed++);
      ASSERT_TRUE(from.Write(Ref(src->id()), data).ok());
      ASSERT_TRUE(to.Write(Ref(dst->id()), before).ok());
      MoveOptions o;
      o.checksum = true;
      auto moved = submit.Move(On(from_node, src->id(), 8, size), On(to_node, dst->id()), o);
      ASSERT_TRUE(moved.ok()) << moved.status();
      ASSERT_EQ(moved->state(), v1::SUCCEEDED) << moved->error_message();
      EXPECT_EQ(moved->path(), v1::CUDA_IPC);  // AUTO picks it: same host, both on GPUs.
      const std::string after = *to.Read(Ref(dst->id()));
      EXPECT_TRUE(after.substr(0, size) == data.substr(8, size));
      EXPECT_TRUE(after.substr(size) == before.substr(size));
      ASSERT_TRUE(from.Release(src->id()).ok());
      ASSERT_TRUE(to.Release(dst->id()).ok());
    }
  }
}

// Vectored moves over CUDA_IPC (the gather kernel on the runner's GPU, the peer's range
// mapped): pushes and pulls both ways, shuffled pieces of 1 B to 100 KiB, and 3000 of
// 1 B to 4 KiB (a list the runner writes at its Submit where the kernel reads it), every
// byte of the destination checked (the gaps too), and a notification published on the
// destination's node only once the bytes are there.
TEST_F(GpuIpcTwoDaemons, VectoredMovesOverCudaIpcPushAndPull) {
  uint64_t seed = 700;
  for (const auto& [n, slot] :
       {std::pair<size_t, uint64_t>{1000, 100 << 10}, std::pair<size_t, uint64_t>{3000, 4096}}) {
    int k = 0;
    for (bool a_to_b : {true, false, true, false}) {
      Client& from = a_to_b ? *ca_ : *cb_;
      Client& to = a_to_b ? *cb_ : *ca_;
      const std::string from_node = a_to_b ? "ipc-a" : "ipc-b";
      const std::string to_node = a_to_b ? "ipc-b" : "ipc-a";
      Client& submit = (k++ < 2) ? from : to;  // Pushes, then pulls.
      SCOPED_TRACE(absl::StrCat(from_node, " -> ", to_node, " by ", k < 3 ? "push" : "pull"));
      std::mt19937_64 rng(++seed);
      std::vector<uint64_t> si(n), di(n);
      for (size_t i = 0; i < n; ++i) si[i] = di[i] = i;
      std::shuffle(si.begin(), si.end(), rng);
      std::shuffle(di.begin(), di.end(), rng);
      auto src = from.Allocate(n * slot, v1::DEVICE, a_to_b ? 0 : other_);
      auto dst = to.Allocate(n * slot, v1::DEVICE, a_to_b ? other_ : 0);
      ASSERT_TRUE(src.ok() && dst.ok()) << src.status() << dst.status();
      const std::string data = RandomBytes(n * slot, seed);
      std::string expected = RandomBytes(n * slot, seed + 1);
      ASSERT_TRUE(from.Write(Ref(src->id()), data).ok());
      ASSERT_TRUE(to.Write(Ref(dst->id()), expected).ok());
      MoveOptions o;
      o.path = v1::CUDA_IPC;
      o.notify = absl::StrCat("ipc ", seed);
      for (size_t i = 0; i < n; ++i) {
        v1::Segment g;
        g.set_source_offset(si[i] * slot);
        g.set_destination_offset(di[i] * slot);
        g.set_length(1 + rng() % slot);
        o.segments.push_back(g);
        expected.replace(g.destination_offset(), g.length(), data, g.source_offset(), g.length());
      }
      v1::NotificationsRequest watch;
      watch.add_buffers(dst->id());
      auto notes = to.Subscribe(watch, absl::Seconds(60));
      ASSERT_TRUE(notes.ok());
      auto moved = submit.Move(On(from_node, src->id()), On(to_node, dst->id()), o);
      ASSERT_TRUE(moved.ok()) << moved.status();
      ASSERT_EQ(moved->state(), v1::SUCCEEDED) << moved->error_message();
      EXPECT_EQ(moved->path(), v1::CUDA_IPC);
      EXPECT_EQ(moved->pieces(), n);
      v1::Notification note;
      ASSERT_TRUE((*notes)->Next(&note));
      EXPECT_EQ(note.notify(), o.notify);
      (*notes)->Cancel();
      EXPECT_TRUE(*to.Read(Ref(dst->id())) == expected);
      ASSERT_TRUE(from.Release(src->id()).ok());
      ASSERT_TRUE(to.Release(dst->id()).ok());
    }
  }
}

// Prepared piece lists over CUDA_IPC: kept on the source's node (a push) or the
// destination's (a pull), each moved twice (the second with the descriptors kept on the
// runner's GPU), every destination byte checked.
TEST_F(GpuIpcTwoDaemons, PreparedListsOverCudaIpcPushAndPull) {
  const size_t n = 800;
  const uint64_t slot = 70 << 10;
  std::mt19937_64 rng(77);
  std::vector<uint64_t> si(n), di(n);
  for (size_t i = 0; i < n; ++i) si[i] = di[i] = i;
  std::shuffle(si.begin(), si.end(), rng);
  std::shuffle(di.begin(), di.end(), rng);
  std::vector<v1::Segment> segments;
  for (size_t i = 0; i < n; ++i) {
    v1::Segment g;
    g.set_source_offset(si[i] * slot);
    g.set_destination_offset(di[i] * slot);
    g.set_length(1 + rng() % slot);
    segments.push_back(g);
  }
  auto src = ca_->Allocate(n * slot, v1::DEVICE, 0);
  auto dst = cb_->Allocate(n * slot, v1::DEVICE, other_);
  ASSERT_TRUE(src.ok() && dst.ok()) << src.status() << dst.status();
  const std::string data = RandomBytes(n * slot, 78);
  ASSERT_TRUE(ca_->Write(Ref(src->id()), data).ok());
  uint64_t seed = 80;
  for (const char* keeper : {"ipc-a", "ipc-b"}) {
    auto list = ca_->PreparePieces(segments, {}, keeper);
    ASSERT_TRUE(list.ok()) << list.status();
    for (int again = 0; again < 2; ++again) {
      SCOPED_TRACE(absl::StrCat("kept on ", keeper, ", move ", again));
      std::string expected = RandomBytes(n * slot, ++seed);
      ASSERT_TRUE(cb_->Write(Ref(dst->id()), expected).ok());
      MoveOptions o;
      o.path = v1::CUDA_IPC;
      o.prepared_pieces = list->id();
      auto moved = ca_->Move(On("ipc-a", src->id()), On("ipc-b", dst->id()), o);
      ASSERT_TRUE(moved.ok()) << moved.status();
      ASSERT_EQ(moved->state(), v1::SUCCEEDED) << moved->error_message();
      EXPECT_EQ(moved->node(), keeper);
      for (const v1::Segment& g : segments) {
        expected.replace(g.destination_offset(), g.length(), data, g.source_offset(), g.length());
      }
      EXPECT_TRUE(*cb_->Read(Ref(dst->id())) == expected);
    }
    ASSERT_TRUE(ca_->ReleasePieces(list->id()).ok());
  }
}

// Moves ipc-a runs onto and out of ipc-b's GPU memory end behind a fence that b waits for
// before it hashes and acknowledges (a checksum was asked): the checksums b returns are of
// the landed bytes.
TEST_F(GpuIpcTwoDaemons, FencedMovesLandBeforeTheyAreAcknowledged) {
  const uint64_t size = 256ull << 20;
  auto src = ca_->Allocate(size, v1::DEVICE, 0);
  auto far = cb_->Allocate(size, v1::DEVICE, other_);
  auto back = ca_->Allocate(size, v1::DEVICE, 0);
  ASSERT_TRUE(src.ok() && far.ok() && back.ok());
  const std::string data = RandomBytes(size, 77);
  ASSERT_TRUE(ca_->Write(Ref(src->id()), data).ok());
  MoveOptions o;
  o.checksum = true;
  o.path = v1::CUDA_IPC;
  ASSERT_NO_FATAL_FAILURE(PushAndPullBack(Ref(src->id()), far->id(), Ref(back->id()), o));
  EXPECT_TRUE(*ca_->Read(Ref(back->id())) == data);
  EXPECT_TRUE(absl::StrContains(b_->Log(), "(after the runner's tail landed)"));  // b waited.
}

// Vectored moves ipc-a runs onto and out of ipc-b's GPU memory end as contiguous ones do:
// the gather kernel's last round runs on behind a fence while b is told (b logs the fence
// it waited for; a copy that went to the end before b was told has none), pushes and
// pulls, with and without a checksum, lists in the Submit and prepared ones (whose first
// gather keeps its descriptors and so goes to the end); every destination byte checked.
TEST_F(GpuIpcTwoDaemons, VectoredMovesEndBehindAFence) {
  const size_t n = 2048;
  const uint64_t slot = 8 << 10;  // 16 MiB ranges: past --cuda_ipc_fence_min.
  std::mt19937_64 rng(91);
  const std::vector<v1::Segment> segments = AsSegments(Shuffled(
      n, slot, slot, [&](size_t) { return slot - rng() % 64; }, 91));
  auto a_mem = ca_->Allocate(n * slot, v1::DEVICE, 0);
  auto b_mem = cb_->Allocate(n * slot, v1::DEVICE, other_);
  ASSERT_TRUE(a_mem.ok() && b_mem.ok()) << a_mem.status() << b_mem.status();
  auto count = [this](const std::string& what) {
    const std::string log = b_->Log();
    size_t k = 0;
    for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) ++k;
    return k;
  };
  const std::string early = "(the hold ends when the runner's tail lands)";
  const std::string waited = "(after the runner's tail landed)";
  auto list = ca_->PreparePieces(segments, {}, "ipc-a");
  ASSERT_TRUE(list.ok()) << list.status();
  uint64_t seed = 92;
  int move = 0;
  for (bool prepared : {false, true}) {
    for (bool checksum : {false, true}) {
      for (bool push : {true, false}) {
        SCOPED_TRACE(absl::StrCat(prepared ? "prepared, " : "", checksum ? "checksum, " : "",
                                  push ? "push" : "pull"));
        Client& from = push ? *ca_ : *cb_;
        Client& to = push ? *cb_ : *ca_;
        const std::string from_id = push ? a_mem->id() : b_mem->id();
        const std::string to_id = push ? b_mem->id() : a_mem->id();
        const std::string data = RandomBytes(n * slot, ++seed);
        std::string expected = RandomBytes(n * slot, ++seed);
        ASSERT_TRUE(from.Write(Ref(from_id), data).ok());
        ASSERT_TRUE(to.Write(Ref(to_id), expected).ok());
        for (const v1::Segment& g : segments) {
          expected.replace(g.destination_offset(), g.length(), data, g.source_offset(), g.length());
        }
        MoveOptions o;
        o.path = v1::CUDA_IPC;
        o.checksum = checksum;
        if (prepared) {
          o.prepared_pieces = list->id();
        } else {
          o.segments = segments;
        }
        const size_t early_before = count(early), waited_before = count(waited);
        auto moved = ca_->Move(On(push ? "ipc-a" : "ipc-b", from_id),
                               On(push ? "ipc-b" : "ipc-a", to_id), o);
        ASSERT_TRUE(moved.ok()) << moved.status();
        ASSERT_EQ(moved->state(), v1::SUCCEEDED) << moved->error_message();
        EXPECT_EQ(moved->pieces(), n);
        EXPECT_TRUE(*to.Read(Ref(to_id)) == expected);
        // Fenced, but for a prepared list's first move (a push: the list's first
        // gather on a's GPU).
        const bool fenced = !(prepared && move == 4);
        ++move;
        EXPECT_EQ(count(early) - early_before, fenced && !checksum ? 1u : 0u);
        EXPECT_EQ(count(waited) - waited_before, fenced && checksum ? 1u : 0u);
      }
    }
  }
  ASSERT_TRUE(ca_->ReleasePieces(list->id()).ok());
}

// Without a checksum, b acknowledges a's fenced copy at once and a reports the move done
// when it sees its own fence pass: the bytes are there at SUCCEEDED, and b's range may be
// released at once (b's Release waits the microseconds until b sees the fence pass too),
// client memory lent to b included.
TEST_F(GpuIpcTwoDaemons, AFencedMoveIsDoneWhenItsBytesLandAndItsRangeMayGoAtOnce) {
  const uint64_t size = 96ull << 20;
  auto src = ca_->Allocate(size, v1::DEVICE, 0);
  auto back = ca_->Allocate(size, v1::DEVICE, 0);
  ASSERT_TRUE(src.ok() && back.ok());
  MoveOptions o;
  o.path = v1::CUDA_IPC;
  for (int i = 0; i < 8; ++i) {
    // Both over --cuda_ipc_fence_min: each move ends behind a fence. b answers the first
    // acknowledgement with a new fence on a serving thread, later ones (the runner reuses
    // its fences) on its progress thread.
    const uint64_t n = i % 4 < 2 ? size : (5ull << 20) + 4097;
    SCOPED_TRACE(absl::StrCat(i, ": ", n, " bytes"));
    const std::string data = RandomBytes(n, 300 + i);
    ASSERT_TRUE(ca_->Write(Ref(src->id(), 0, n), data).ok());
    if (i % 2 == 0) {
      // Into b's pool memory and back out of it (a pull), each checked.
      auto far = cb_->Allocate(n, v1::DEVICE, other_);
      ASSERT_TRUE(far.ok()) << far.status();
      ASSERT_NO_FATAL_FAILURE(
          PushAndPullBack(Ref(src->id(), 0, n), far->id(), Ref(back->id(), 0, n), o));
      EXPECT_TRUE(cb_->Release(far->id()).ok());  // At once.
      EXPECT_TRUE(*ca_->Read(Ref(back->id(), 0, n)) == data);
    } else {
      // Into client memory lent to b: released at once, then read where it lives.
      ClientMemory mem(other_, RandomBytes(n, 400 + i));
      v1::ImportRequest req;
      req.set_cuda_ipc_handle(mem.handle);
      req.set_size(n);
      req.set_device_uuid(Uuid(other_));
      auto lent = cb_->Import(req);
      ASSERT_TRUE(lent.ok()) << lent.status();
      auto push = ca_->Move(Ref(src->id(), 0, n), On("ipc-b", lent->id()), o);
      ASSERT_TRUE(push.ok()) << push.status();
      ASSERT_EQ(push->state(), v1::SUCCEEDED) << push->error_message();
      EXPECT_TRUE(cb_->Release(lent->id()).ok());
      EXPECT_TRUE(mem.Contents(0, n) == data);
    }
  }
  // b took the early way (not the one a checksum takes).
  EXPECT_TRUE(absl::StrContains(b_->Log(), "the hold ends when the runner's tail lands"));
}

TEST_F(GpuIpcTwoDaemons, ClientMemoryLentToOneDaemonReachesTheOther) {
  const std::string data = RandomBytes(16 << 20, 21);
  ClientMemory mem(0, data);
  v1::ImportRequest req;
  req.set_cuda_ipc_handle(mem.handle);
  req.set_size(data.size());
  req.set_device_uuid(Uuid(0));
  auto b = ca_->Import(req);
  ASSERT_TRUE(b.ok()) << b.status();
  auto dst = cb_->Allocate(data.size(), v1::DEVICE, other_);
  MoveOptions o;
  o.checksum = true;
  auto moved = cb_->Move(On("ipc-a", b->id()), Ref(dst->id()), o);  // ipc-b pulls.
  ASSERT_TRUE(moved.ok()) << moved.status();
  ASSERT_EQ(moved->state(), v1::SUCCEEDED) << moved->error_message();
  EXPECT_EQ(moved->path(), v1::CUDA_IPC);
  EXPECT_TRUE(*cb_->Read(Ref(dst->id())) == data);
}

// A CUDA_IPC move's acknowledgement may carry the interprocess event its copy ends at; the
// node that holds the range waits for it. A handle the driver refuses gets
// INVALID_ARGUMENT, the hold is let go, and the daemon keeps serving.
TEST_F(GpuIpcTwoDaemons, ABadFenceIsRefusedAndTheHoldLetGo) {
  auto dst = cb_->Allocate(1 << 20, v1::DEVICE, other_);
  ASSERT_TRUE(dst.ok()) << dst.status();
  auto peer = peer::v1::PeerService::NewStub(
      grpc::CreateChannel(b_->address(), grpc::InsecureChannelCredentials()));
  // A node holds ranges only for peers it has met, at their incarnation: call as ipc-a,
  // with the incarnation ipc-a says Hello with.
  uint64_t incarnation = 0;
  {
    auto a = peer::v1::PeerService::NewStub(
        grpc::CreateChannel(a_->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    peer::v1::HelloResponse hello;
    ASSERT_TRUE(a->Hello(&ctx, peer::v1::HelloRequest(), &hello).ok());
    incarnation = hello.node().incarnation();
  }
  int n = 0;
  for (const std::string& fence : {std::string(64, '\x5a'), std::string(10, 'x')}) {
    SCOPED_TRACE(absl::StrCat(fence.size(), "-byte fence"));
    const std::string id = absl::StrCat("t-bad-fence-", n++);
    peer::v1::PrepareRemoteRequest prepare;
    prepare.set_transfer_id(id);
    prepare.set_from_node("ipc-a");
    prepare.set_from_incarnation(incarnation);
    prepare.set_owner("anonymous");
    *prepare.mutable_range() = Ref(dst->id());
    prepare.set_write(true);
    prepare.set_path(v1::CUDA_IPC);
    prepare.set_runner_device(true);
    peer::v1::PrepareRemoteResponse held;
    {
      grpc::ClientContext ctx;
      ASSERT_TRUE(PrepareOne(*peer, &ctx, prepare, &held).ok());
    }
    EXPECT_TRUE(held.cuda_ipc().reads_tails());
    EXPECT_FALSE(held.cuda_ipc().handle().empty());
    peer::v1::CompleteRemoteRequest complete;
    complete.set_transfer_id(id);
    complete.set_from_node("ipc-a");
    complete.set_tail_token(fence);
    peer::v1::CompleteRemoteResponse acked;
    grpc::ClientContext ctx;
    const grpc::Status st = CompleteOne(*peer, &ctx, complete, &acked);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_EQ(cb_->GetBuffer(dst->id())->active_uses(), 0u);
  }
  EXPECT_TRUE(cb_->GetInfo().ok());
}

TEST_F(GpuIpcTwoDaemons, CancelStopsAMoveAndReleasesBothEnds) {
  const uint64_t size = 1ull << 30;
  auto dst = cb_->Allocate(size, v1::DEVICE, other_);
  ASSERT_TRUE(dst.ok()) << dst.status();
  // A slow node: a new daemon with a rate cap runs the move.
  auto slow = DaemonProcess::Start({"--node=ipc-s", "--gpus=0", "--device_pool_size=1100MiB",
                                    "--max_move_rate=512MiB", "--peers=" + a_->address()});
  ASSERT_TRUE(slow.ok()) << slow.status();
  auto cs = *Client::Connect((*slow)->address());
  for (int i = 0; i < 200 && cs->ListPeers()->size() < 2; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  auto s_src = cs->Allocate(size, v1::DEVICE, 0);
  ASSERT_TRUE(s_src.ok()) << s_src.status();
  MoveOptions o;
  o.wait = false;
  auto t = cs->Move(Ref(s_src->id()), On("ipc-b", dst->id()), o);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(ca_->Cancel(t->id()).ok());
  auto end = ca_->Wait(t->id(), absl::Seconds(10));
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::CANCELLED);
  EXPECT_EQ(end->path(), v1::CUDA_IPC);
  EXPECT_LT(end->bytes_done(), size);
  EXPECT_EQ(cb_->GetBuffer(dst->id())->active_uses(), 0u);
  EXPECT_TRUE(cs->Release(s_src->id()).ok());
}

// Path MPI with device memory: Open MPI on the GPU machine is not CUDA-aware, so each
// rank stages its GPU memory through pinned bounce buffers.
TEST(GpuMpi, DeviceBuffersMoveOverStagedMpiVerified) {
  if (GpuCount() == 0) GTEST_SKIP() << "no GPU";
  auto job = MpiJob::Start(2, MpiLaunch{"default", {}, {}},
                           {"--device_pool_size=1GiB", "--pinned_pool_size=256MiB",
                            "--mpi_chunk=4MiB", "--noucx"});
  ASSERT_TRUE(job.ok()) << job.status();
  for (int i = 0; i < 200 && (*job)->client(0).ListPeers()->empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  Client& c0 = (*job)->client(0);
  Client& c1 = (*job)->client(1);
  uint64_t seed = 40;
  const int other = GpuCount() > 1 ? 1 : 0;
  for (uint64_t size : {1ull, (5ull << 20) + 3, 300ull << 20}) {
    SCOPED_TRACE(absl::StrCat(size, " bytes"));
    auto src = c0.Allocate(size, v1::DEVICE, 0);
    auto dst = c1.Allocate(size, v1::DEVICE, other);
    auto back = c0.Allocate(size, v1::HOST);
    ASSERT_TRUE(src.ok() && dst.ok() && back.ok()) << src.status() << dst.status();
    const std::string data = RandomBytes(size, seed++);
    ASSERT_TRUE(c0.Write(Ref(src->id()), data).ok());
    MoveOptions o;
    o.checksum = true;
    o.path = v1::MPI;
    auto push = c0.Move(Ref(src->id()), On("rank1", dst->id()), o);  // Staged both sides.
    ASSERT_TRUE(push.ok()) << push.status();
    ASSERT_EQ(push->state(), v1::SUCCEEDED) << push->error_message();
    EXPECT_TRUE(*c1.Read(Ref(dst->id())) == data);
    auto pull = c0.Move(On("rank1", dst->id()), Ref(back->id()), o);  // Device -> host.
    ASSERT_TRUE(pull.ok()) << pull.status();
    ASSERT_EQ(pull->state(), v1::SUCCEEDED) << pull->error_message();
    EXPECT_TRUE(*c0.Read(Ref(back->id())) == data);
    ASSERT_TRUE(c0.Release(src->id()).ok());
    ASSERT_TRUE(c1.Release(dst->id()).ok());
    ASSERT_TRUE(c0.Release(back->id()).ok());
  }
  // Vectored: each rank packs its pieces on the GPU into its bounce slots (many tiny pieces
  // to a message; pieces longer than a message cut across several); device <-> device
  // both ways, and device -> host.
  for (const auto& [n, slot, max_len] : {std::tuple<size_t, uint64_t, uint64_t>{20000, 17, 16},
                                        {2000, 4099, 4096},
                                        {6, (9 << 20) + 5, 9 << 20}}) {
    const NodeEnd r0{&c0, "rank0"}, r1{&c1, "rank1"};
    for (const auto& [from, to, to_kind] :
         {std::tuple{r0, r1, v1::DEVICE}, {r1, r0, v1::DEVICE}, {r1, r0, v1::HOST}}) {
      MoveVectoredAndCheck(from, to, r0, v1::MPI, v1::MPI, RandomPieces(n, slot, max_len, seed),
                           n * slot, n * (slot + 3), seed, v1::DEVICE, to_kind);
      ++seed;
    }
  }
  auto info = c0.GetInfo();
  for (const auto& p : info->paths()) {
    if (p.path() == v1::MPI) std::cout << "MPI path: " << p.reason() << "\n";
  }
}

#else

TEST(GpuIpc, NeedsCuda) { GTEST_SKIP() << "built without the CUDA toolkit"; }

#endif  // GPUMOVE_HAVE_CUDA

}  // namespace
}  // namespace gpumove
