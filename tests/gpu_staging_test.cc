// GPU suite for the staged UCX path (tag "gpu"; run on the GPU machine, whose UCX is not
// CUDA-aware): two daemons on one host; device memory pushed to and pulled from the other
// node's host memory (staged on the running side), and device to device across nodes
// (staged on both sides), verified; vectored moves staged on one side and on both.
#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/gpumove_client.h"
#include "gtest/gtest.h"
#include "tests/util/daemon_process.h"
#include "tests/util/pieces.h"
#include "tests/util/random_bytes.h"

namespace gpumove {
namespace {

v1::BufferRef On(const std::string& node, const std::string& id, uint64_t offset = 0,
                 uint64_t length = 0) {
  v1::BufferRef r = Ref(id, offset, length);
  r.set_node(node);
  return r;
}

// `n` shuffled pieces of 1..max_len bytes in slots of `slot` bytes on both sides.
std::vector<Piece> Shuffled(size_t n, uint64_t slot, uint64_t max_len, uint64_t seed) {
  std::mt19937_64 rng(seed + 1);
  return gpumove::Shuffled(
      n, slot, slot, [&](size_t) { return 1 + rng() % max_len; }, seed);
}

class GpuStaging : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ =
        *DaemonProcess::Start({"--node=gpu-a", "--device_pool_size=3GiB", "--host_pool_size=256MiB",
                               "--pinned_pool_size=256MiB", "--metrics_listen=127.0.0.1:0"});
    b_ = *DaemonProcess::Start({"--node=gpu-b", "--device_pool_size=2560MiB",
                                "--host_pool_size=2560MiB", "--pinned_pool_size=256MiB",
                                "--metrics_listen=127.0.0.1:0", "--peers=" + a_->address()});
    ca_ = *Client::Connect(a_->address());
    cb_ = *Client::Connect(b_->address());
    for (int i = 0; i < 200 && ca_->ListPeers()->empty(); ++i) absl::SleepFor(absl::Milliseconds(50));
    ASSERT_EQ(ca_->ListPeers()->size(), 1u);
  }
  // Pieces either node copied one call each instead of by a gather kernel (none should
  // be: every staged window's host side is a pinned slot the kernel reaches).
  void ExpectNoPieceCopiedAlone() {
    absl::SleepFor(absl::Milliseconds(1200));  // The counters lag by up to a second.
    for (Client* c : {ca_.get(), cb_.get()}) {
      EXPECT_EQ(MetricValue(c->GetInfo()->metrics_address(), "gpu_pieces_copied_one_by_one_total"),
                0)
          << c->GetInfo()->node();
    }
  }
  std::unique_ptr<DaemonProcess> a_, b_;
  std::unique_ptr<Client> ca_, cb_;
};

TEST_F(GpuStaging, DevicePushedToAndPulledFromAnotherNodeVerified) {
  const int gpus = ca_->GetInfo()->gpus_size();
  ASSERT_GE(gpus, 1);
  uint64_t seed = 50;
  for (uint64_t size : {1ull, (3ull << 20) + 5, 100ull << 20}) {
    for (int g = 0; g < gpus; ++g) {
      SCOPED_TRACE(absl::StrCat("GPU ", g, ", ", size, " bytes"));
      auto dev = ca_->Allocate(size, v1::DEVICE, g);
      auto host = cb_->Allocate(size, g % 2 ? v1::PINNED_HOST : v1::HOST);
      auto back = ca_->Allocate(size, v1::DEVICE, gpus - 1 - g);
      ASSERT_TRUE(dev.ok() && host.ok() && back.ok()) << dev.status() << host.status() << back.status();
      const std::string data = RandomBytes(size, seed++);
      ASSERT_TRUE(ca_->Write(Ref(dev->id()), data).ok());
      MoveOptions o;
      o.checksum = true;
      // Push: gpu-a stages its device memory out to gpu-b's host memory.
      auto push = ca_->Move(Ref(dev->id()), On("gpu-b", host->id()), o);
      ASSERT_TRUE(push.ok()) << push.status();
      ASSERT_EQ(push->state(), v1::SUCCEEDED) << push->error_message();
      EXPECT_EQ(push->path(), v1::UCX);
      EXPECT_TRUE(*cb_->Read(Ref(host->id())) == data);
      // Pull: gpu-a stages gpu-b's host memory into its other GPU.
      auto pull = ca_->Move(On("gpu-b", host->id()), Ref(back->id()), o);
      ASSERT_TRUE(pull.ok()) << pull.status();
      ASSERT_EQ(pull->state(), v1::SUCCEEDED) << pull->error_message();
      EXPECT_TRUE(*ca_->Read(Ref(back->id())) == data);
      for (auto* b : {&*dev, &*back}) ASSERT_TRUE(ca_->Release(b->id()).ok());
      ASSERT_TRUE(cb_->Release(host->id()).ok());
    }
  }
}

TEST_F(GpuStaging, DeviceToDeviceAcrossNodesVerified) {
  const int gpus = ca_->GetInfo()->gpus_size();
  uint64_t seed = 70;
  for (uint64_t size : {(5ull << 20) + 3, 200ull << 20}) {
    SCOPED_TRACE(absl::StrCat(size, " bytes"));
    auto a_dev = ca_->Allocate(size, v1::DEVICE, 0);
    auto b_dev = cb_->Allocate(size, v1::DEVICE, gpus - 1);
    auto a_back = ca_->Allocate(size, v1::DEVICE, gpus - 1);
    ASSERT_TRUE(a_dev.ok() && b_dev.ok() && a_back.ok());
    const std::string data = RandomBytes(size, seed++);
    ASSERT_TRUE(ca_->Write(Ref(a_dev->id()), data).ok());
    MoveOptions o;
    o.checksum = true;
    o.path = v1::UCX;  // AUTO would take CUDA_IPC between daemons on one host.
    // Push from gpu-a's GPU into gpu-b's GPU, submitted at gpu-b (so gpu-b pulls).
    auto pull = cb_->Move(On("gpu-a", a_dev->id()), Ref(b_dev->id()), o);
    ASSERT_TRUE(pull.ok()) << pull.status();
    ASSERT_EQ(pull->state(), v1::SUCCEEDED) << pull->error_message();
    EXPECT_EQ(pull->path(), v1::UCX);
    EXPECT_TRUE(*cb_->Read(Ref(b_dev->id())) == data);
    // And back, pushed by gpu-b.
    auto push = cb_->Move(Ref(b_dev->id()), On("gpu-a", a_back->id()), o);
    ASSERT_TRUE(push.ok()) << push.status();
    ASSERT_EQ(push->state(), v1::SUCCEEDED) << push->error_message();
    EXPECT_TRUE(*ca_->Read(Ref(a_back->id())) == data);
    for (auto& id : {a_dev->id(), a_back->id()}) ASSERT_TRUE(ca_->Release(id).ok());
    ASSERT_TRUE(cb_->Release(b_dev->id()).ok());
  }
}

// Vectored moves of device memory over a UCX that is not CUDA-aware, to and from the
// other node's host memory: rounds of pieces gathered into (or scattered out of) the
// runner's bounce slots on the GPU, each piece put or got at its place there. Small
// pieces, and pieces longer than a slot (8 MiB; cut across rounds); every byte of the
// destination checked, the gaps too; checksums of both sides equal.
TEST_F(GpuStaging, VectoredDeviceMovesStagedByTheRunner) {
  struct Shape {
    size_t n;
    uint64_t slot, max_len;
  };
  uint64_t seed = 90;
  for (const Shape& k : {Shape{3000, 701, 700}, Shape{4096, 4096, 4096},
                         Shape{12, (12ull << 20) + 64, 12ull << 20}}) {
    ++seed;
    SCOPED_TRACE(absl::StrCat(k.n, " pieces of up to ", k.max_len, " bytes"));
    const uint64_t size = k.n * k.slot;
    auto dev = ca_->Allocate(size, v1::DEVICE, 0);
    auto host = cb_->Allocate(size, v1::HOST);
    auto back = ca_->Allocate(size, v1::DEVICE, 0);
    ASSERT_TRUE(dev.ok() && host.ok() && back.ok())
        << dev.status() << host.status() << back.status();
    const std::string data = RandomBytes(size, seed);
    const std::string host_before = RandomBytes(size, seed + 100);
    const std::string back_before = RandomBytes(size, seed + 200);
    ASSERT_TRUE(ca_->Write(Ref(dev->id()), data).ok());
    ASSERT_TRUE(cb_->Write(Ref(host->id()), host_before).ok());
    ASSERT_TRUE(ca_->Write(Ref(back->id()), back_before).ok());
    const std::vector<Piece> out = Shuffled(k.n, k.slot, k.max_len, seed);
    MoveOptions o;
    o.segments = AsSegments(out);
    o.checksum = true;
    o.path = v1::UCX;
    // Push, run by gpu-a: gathered on its GPU, put piece by piece into gpu-b's host memory.
    auto push = ca_->Move(Ref(dev->id()), On("gpu-b", host->id()), o);
    ASSERT_TRUE(push.ok()) << push.status();
    ASSERT_EQ(push->state(), v1::SUCCEEDED) << push->error_message();
    EXPECT_EQ(push->pieces(), k.n);
    EXPECT_EQ(push->destination_xxh3(), push->source_xxh3());
    const std::string host_after = Expected(data, host_before, out);
    EXPECT_TRUE(*cb_->Read(Ref(host->id())) == host_after);
    // Pull, run by gpu-a: got piece by piece into its slots, scattered on its GPU.
    const std::vector<Piece> in = Shuffled(k.n, k.slot, k.max_len, seed + 7);
    o.segments = AsSegments(in);
    auto pull = ca_->Move(On("gpu-b", host->id()), Ref(back->id()), o);
    ASSERT_TRUE(pull.ok()) << pull.status();
    ASSERT_EQ(pull->state(), v1::SUCCEEDED) << pull->error_message();
    EXPECT_EQ(pull->destination_xxh3(), pull->source_xxh3());
    EXPECT_TRUE(*ca_->Read(Ref(back->id())) == Expected(host_after, back_before, in));
    for (auto* b : {&*dev, &*back}) ASSERT_TRUE(ca_->Release(b->id()).ok());
    ASSERT_TRUE(cb_->Release(host->id()).ok());
  }
  ExpectNoPieceCopiedAlone();
}

// Vectored device -> device moves across nodes with a UCX that is not CUDA-aware: staged
// on both sides (gathered on the runner's GPU into its slots, put into the other node's
// slots, scattered there by its GPU; a pull the other way round), a round's copy there
// overlapping the next round here. Every byte checked, checksums equal.
TEST_F(GpuStaging, VectoredDeviceToDeviceStagedOnBothSides) {
  struct Shape {
    size_t n;
    uint64_t slot, max_len;
  };
  uint64_t seed = 190;
  for (const Shape& k : {Shape{20000, 33, 32}, Shape{4096, 4096, 4096},
                         Shape{8, (10ull << 20) + 64, 10ull << 20}}) {
    ++seed;
    SCOPED_TRACE(absl::StrCat(k.n, " pieces of up to ", k.max_len, " bytes"));
    const uint64_t size = k.n * k.slot;
    auto a_dev = ca_->Allocate(size, v1::DEVICE, 0);
    auto b_dev = cb_->Allocate(size, v1::DEVICE, 0);
    auto a_back = ca_->Allocate(size, v1::DEVICE, 0);
    ASSERT_TRUE(a_dev.ok() && b_dev.ok() && a_back.ok());
    const std::string data = RandomBytes(size, seed);
    const std::string b_before = RandomBytes(size, seed + 1);
    const std::string back_before = RandomBytes(size, seed + 2);
    ASSERT_TRUE(ca_->Write(Ref(a_dev->id()), data).ok());
    ASSERT_TRUE(cb_->Write(Ref(b_dev->id()), b_before).ok());
    ASSERT_TRUE(ca_->Write(Ref(a_back->id()), back_before).ok());
    const std::vector<Piece> out = Shuffled(k.n, k.slot, k.max_len, seed);
    MoveOptions o;
    o.segments = AsSegments(out);
    o.checksum = true;
    o.path = v1::UCX;  // AUTO would take CUDA_IPC between daemons on one host.
    auto push = ca_->Move(Ref(a_dev->id()), On("gpu-b", b_dev->id()), o);
    ASSERT_TRUE(push.ok()) << push.status();
    ASSERT_EQ(push->state(), v1::SUCCEEDED) << push->error_message();
    EXPECT_EQ(push->destination_xxh3(), push->source_xxh3());
    const std::string b_after = Expected(data, b_before, out);
    EXPECT_TRUE(*cb_->Read(Ref(b_dev->id())) == b_after);
    const std::vector<Piece> in = Shuffled(k.n, k.slot, k.max_len, seed + 7);
    o.segments = AsSegments(in);
    auto pull = ca_->Move(On("gpu-b", b_dev->id()), Ref(a_back->id()), o);
    ASSERT_TRUE(pull.ok()) << pull.status();
    ASSERT_EQ(pull->state(), v1::SUCCEEDED) << pull->error_message();
    EXPECT_EQ(pull->destination_xxh3(), pull->source_xxh3());
    EXPECT_TRUE(*ca_->Read(Ref(a_back->id())) == Expected(b_after, back_before, in));
    for (auto& id : {a_dev->id(), a_back->id()}) ASSERT_TRUE(ca_->Release(id).ok());
    ASSERT_TRUE(cb_->Release(b_dev->id()).ok());
  }
  ExpectNoPieceCopiedAlone();
}

// The host copies of a staged move that runs two at once (a push from our bounce slots
// to the other node's memory, the wire step between two nodes' slots) are split over
// --staged_copy_threads; other direct copies (a pull into our slots, one piece at a time;
// host to host) over --direct_copy_threads: counted by the helper-bytes metric.
TEST_F(GpuStaging, StagedCopiesSplitOverTheirOwnThreads) {
  auto c = DaemonProcess::Start({"--node=gpu-c", "--device_pool_size=256MiB",
                                 "--host_pool_size=64MiB", "--pinned_pool_size=64MiB",
                                 "--metrics_listen=127.0.0.1:0", "--direct_copy_threads=4",
                                 "--staged_copy_threads=1", "--peers=" + a_->address()});
  ASSERT_TRUE(c.ok()) << c.status();
  auto cc = *Client::Connect((*c)->address());
  for (int i = 0; i < 200 && cc->ListPeers()->size() < 2; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(cc->ListPeers()->size(), 2u);
  auto helped = [&cc] {
    absl::SleepFor(absl::Milliseconds(1200));  // The counter lags by up to a second.
    return MetricValue(cc->GetInfo()->metrics_address(), "host_copy_helper_bytes_total");
  };
  const uint64_t size = 16 << 20;
  auto dev = cc->Allocate(size, v1::DEVICE, 0);
  auto host = cc->Allocate(size);
  auto a_host = ca_->Allocate(size);
  auto a_dev = ca_->Allocate(size, v1::DEVICE, 0);
  ASSERT_TRUE(dev.ok() && host.ok() && a_host.ok() && a_dev.ok());
  const std::string data = RandomBytes(size, 77);
  ASSERT_TRUE(cc->Write(Ref(dev->id()), data).ok());
  const double before = helped();
  ASSERT_GE(before, 0) << "no helper-bytes counter";
  MoveOptions o;
  o.checksum = true;
  o.path = v1::UCX;
  auto move = [&](const v1::BufferRef& from, const v1::BufferRef& to) {
    auto t = cc->Move(from, to, o);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ(t->state(), v1::SUCCEEDED) << t->error_message();
  };
  move(Ref(dev->id()), On("gpu-a", a_host->id()));  // Staged out of our slots.
  move(Ref(dev->id()), On("gpu-a", a_dev->id()));   // Through both nodes' slots.
  if (HasFatalFailure()) return;
  EXPECT_TRUE(*ca_->Read(Ref(a_dev->id())) == data);
  EXPECT_EQ(helped(), before) << "a staged push's host copies were split over threads";
  // Each of four threads a quarter of every copy, so helpers copy three quarters.
  move(On("gpu-a", a_host->id()), Ref(dev->id()));  // Staged into our slots.
  if (HasFatalFailure()) return;
  EXPECT_EQ(helped(), before + size - size / 4);
  move(On("gpu-a", a_host->id()), Ref(host->id()));  // Host to host.
  if (HasFatalFailure()) return;
  EXPECT_TRUE(*cc->Read(Ref(host->id())) == data);
  EXPECT_EQ(helped(), before + 2 * (size - size / 4));
}

TEST_F(GpuStaging, LargeStagedPushThroughput) {
  const uint64_t size = 2ull << 30;
  auto dev = ca_->Allocate(size, v1::DEVICE, 0);
  auto host = cb_->Allocate(size);
  ASSERT_TRUE(dev.ok() && host.ok());
  for (int i = 0; i < 3; ++i) {
    auto push = ca_->Move(Ref(dev->id()), On("gpu-b", host->id()));
    ASSERT_TRUE(push.ok() && push->state() == v1::SUCCEEDED);
    const double s = (push->end_time().seconds() - push->start_time().seconds()) +
                     (push->end_time().nanos() - push->start_time().nanos()) * 1e-9;
    std::cout << "staged push GPU0 -> other node's host, 2 GiB: " << size / s / 1e9 << " GB/s\n";
    auto pull = ca_->Move(On("gpu-b", host->id()), Ref(dev->id()));
    ASSERT_TRUE(pull.ok() && pull->state() == v1::SUCCEEDED);
    const double p = (pull->end_time().seconds() - pull->start_time().seconds()) +
                     (pull->end_time().nanos() - pull->start_time().nanos()) * 1e-9;
    std::cout << "staged pull other node's host -> GPU0, 2 GiB: " << size / p / 1e9 << " GB/s\n";
  }
  auto b_dev = cb_->Allocate(size, v1::DEVICE, 1 % ca_->GetInfo()->gpus_size());
  ASSERT_TRUE(b_dev.ok()) << b_dev.status();
  MoveOptions ucx;
  ucx.path = v1::UCX;
  for (int i = 0; i < 3; ++i) {
    auto d2d = ca_->Move(Ref(dev->id()), On("gpu-b", b_dev->id()), ucx);
    ASSERT_TRUE(d2d.ok() && d2d->state() == v1::SUCCEEDED);
    const double s = (d2d->end_time().seconds() - d2d->start_time().seconds()) +
                     (d2d->end_time().nanos() - d2d->start_time().nanos()) * 1e-9;
    std::cout << "staged both sides GPU0 (gpu-a) -> GPU (gpu-b), 2 GiB: " << size / s / 1e9
              << " GB/s\n";
  }
}

}  // namespace
}  // namespace gpumove
