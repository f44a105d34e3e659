// GPU suite for path LOCAL (tag "gpu"; run on the GPU machine): device pools, every
// direction between host, pinned and each GPU, checksums, cancel, bad device requests.
#include <algorithm>
#include <numeric>
#include <random>
#include <string>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/gpumove_client.h"
#include "gtest/gtest.h"
#include "tests/util/daemon_process.h"
#include "tests/util/pieces.h"
#include "tests/util/random_bytes.h"

namespace gpumove {
namespace {

class GpuLocal : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto p = DaemonProcess::Start({"--host_pool_size=1GiB", "--pinned_pool_size=512MiB",
                                   "--device_pool_size=2GiB", "--node=gpu-node",
                                   "--max_move_rate=0"});
    ASSERT_TRUE(p.ok()) << p.status();
    process_ = p->release();
    client_ = Client::Connect(process_->address())->release();
  }
  static void TearDownTestSuite() {
    delete client_;
    delete process_;
  }
  int Gpus() { return client_->GetInfo()->gpus_size(); }

  static DaemonProcess* process_;
  static Client* client_;
};

// A daemon of the test's own whose --v=2 lines the test reads, without a rate cap.
absl::StatusOr<std::unique_ptr<DaemonProcess>> StartLogged() {
  return DaemonProcess::Start({"--host_pool_size=256MiB", "--pinned_pool_size=256MiB",
                               "--device_pool_size=1GiB", "--node=gpu-node", "--v=2",
                               "--max_move_rate=0"});
}

DaemonProcess* GpuLocal::process_ = nullptr;
Client* GpuLocal::client_ = nullptr;

TEST_F(GpuLocal, NodeInfoShowsGpusPoolsAndPeers) {
  auto info = client_->GetInfo();
  ASSERT_TRUE(info.ok());
  ASSERT_GE(info->gpus_size(), 1) << info->gpu_status();
  EXPECT_TRUE(info->cuda_compiled());
  int device_pools = 0;
  for (const auto& p : info->pools()) {
    if (p.kind() == v1::DEVICE) {
      ++device_pools;
      EXPECT_EQ(p.capacity(), 2ull << 30);
    }
    if (p.kind() == v1::PINNED_HOST) {
      EXPECT_TRUE(p.locked());
    }
  }
  EXPECT_EQ(device_pools, info->gpus_size());
  for (const auto& g : info->gpus()) {
    EXPECT_EQ(g.uuid().rfind("GPU-", 0), 0u) << g.uuid();
    if (info->gpus_size() > 1) {
      EXPECT_GE(g.peer_access_size(), 1) << "no peer access from " << g.index();
    }
  }
  std::cout << info->DebugString();
}

TEST_F(GpuLocal, EveryDirectionMovesVerifiedBytes) {
  struct Place {
    std::string name;
    v1::MemoryKind kind;
    int device;
  };
  std::vector<Place> places = {{"host", v1::HOST, 0}, {"pinned", v1::PINNED_HOST, 0}};
  for (int g = 0; g < Gpus(); ++g) places.push_back({absl::StrCat("gpu", g), v1::DEVICE, g});
  uint64_t seed = 100;
  for (uint64_t size : {1ull, 4097ull, (3ull << 20) + 5, 96ull << 20}) {
    for (const Place& from : places) {
      for (const Place& to : places) {
        SCOPED_TRACE(absl::StrCat(from.name, " -> ", to.name, " ", size, " bytes"));
        auto src = client_->Allocate(size + 64, from.kind, from.device);
        auto dst = client_->Allocate(size + 128, to.kind, to.device);
        ASSERT_TRUE(src.ok() && dst.ok()) << src.status() << dst.status();
        const std::string data = RandomBytes(size + 64, seed++);
        const std::string before = RandomBytes(size + 128, seed++);
        ASSERT_TRUE(client_->Write(Ref(src->id()), data).ok());
        ASSERT_TRUE(client_->Write(Ref(dst->id()), before).ok());
        MoveOptions o;
        o.checksum = true;
        auto t = client_->Move(Ref(src->id(), 64, size), Ref(dst->id(), 32), o);
        ASSERT_TRUE(t.ok()) << t.status();
        ASSERT_EQ(t->state(), v1::SUCCEEDED) << t->error_message();
        EXPECT_EQ(t->source_xxh3(), t->destination_xxh3());
        EXPECT_EQ(t->source_xxh3(), XXH3_64bits(data.data() + 64, size));
        const std::string after = *client_->Read(Ref(dst->id()));
        EXPECT_TRUE(after.substr(0, 32) == before.substr(0, 32));
        EXPECT_TRUE(after.substr(32, size) == data.substr(64, size));
        EXPECT_TRUE(after.substr(32 + size) == before.substr(32 + size));
        ASSERT_TRUE(client_->Release(src->id()).ok());
        ASSERT_TRUE(client_->Release(dst->id()).ok());
      }
    }
  }
}

// Checksums of device ranges: from 1 MiB the GPU sums the 1 KiB blocks (8-byte aligned
// starts; others are hashed on the host), and both must be the xxh3 the client computes.
TEST_F(GpuLocal, DeviceChecksumsAreTheHostsXxh3) {
  uint64_t seed = 300;
  for (uint64_t size : {(1ull << 20) - 1, 1ull << 20, (1ull << 20) + 1, (64ull << 20) + 1024,
                        (200ull << 20) + 17}) {
    for (uint64_t offset : {0ull, 1ull, 8ull}) {
      SCOPED_TRACE(absl::StrCat(size, " bytes at ", offset));
      auto src = client_->Allocate(size + offset, v1::DEVICE, 0);
      auto dst = client_->Allocate(size + 8, v1::DEVICE, 0);
      ASSERT_TRUE(src.ok() && dst.ok()) << src.status() << dst.status();
      const std::string data = RandomBytes(size + offset, seed++);
      ASSERT_TRUE(client_->Write(Ref(src->id()), data).ok());
      MoveOptions o;
      o.checksum = true;
      auto t = client_->Move(Ref(src->id(), offset, size), Ref(dst->id(), 8 - offset % 8), o);
      ASSERT_TRUE(t.ok()) << t.status();
      ASSERT_EQ(t->state(), v1::SUCCEEDED) << t->error_message();
      const uint64_t want = XXH3_64bits(data.data() + offset, size);
      EXPECT_EQ(t->source_xxh3(), want);
      EXPECT_EQ(t->destination_xxh3(), want);
      ASSERT_TRUE(client_->Release(src->id()).ok());
      ASSERT_TRUE(client_->Release(dst->id()).ok());
    }
  }
}

// Vectored moves (one gather kernel per round where one GPU reaches both ends, piece by
// piece from pageable host memory): shuffled pieces of 1 B to 1 MiB (pieces past the
// kernel's 64 KiB cut), unaligned and aligned, every destination byte checked (the
// gaps too), checksums equal to the local xxh3 of the pieces in list order.
TEST_F(GpuLocal, VectoredMovesInEveryDirection) {
  struct Place {
    std::string name;
    v1::MemoryKind kind;
    int device;
  };
  std::vector<Place> places = {{"host", v1::HOST, 0}, {"pinned", v1::PINNED_HOST, 0}};
  for (int g = 0; g < Gpus(); ++g) places.push_back({absl::StrCat("gpu", g), v1::DEVICE, g});
  struct Shape {
    size_t n;
    uint64_t max_len, slot;  // Pieces of 1..max_len bytes in slots of `slot` bytes.
    bool fixed;              // Every piece max_len long (aligned blocks).
  };
  uint64_t seed = 900;
  for (const Shape& k : {Shape{3000, 700, 701, false}, Shape{4096, 4096, 4096, true},
                         Shape{40, 1 << 20, (1 << 20) + 48, false}}) {
    for (const Place& from : places) {
      for (const Place& to : places) {
        ++seed;
        SCOPED_TRACE(absl::StrCat(from.name, " -> ", to.name, ", ", k.n, " pieces of up to ",
                                  k.max_len));
        std::mt19937_64 rng(seed);
        std::vector<uint64_t> si(k.n), di(k.n);
        std::iota(si.begin(), si.end(), 0);
        std::iota(di.begin(), di.end(), 0);
        std::shuffle(si.begin(), si.end(), rng);
        std::shuffle(di.begin(), di.end(), rng);
        const uint64_t size = k.n * k.slot;
        auto src = client_->Allocate(size, from.kind, from.device);
        auto dst = client_->Allocate(size, to.kind, to.device);
        ASSERT_TRUE(src.ok() && dst.ok()) << src.status() << dst.status();
        const std::string data = RandomBytes(size, seed);
        std::string expected = RandomBytes(size, seed + 1);
        ASSERT_TRUE(client_->Write(Ref(src->id()), data).ok());
        ASSERT_TRUE(client_->Write(Ref(dst->id()), expected).ok());
        MoveOptions o;
        o.checksum = true;
        std::string pieces;
        for (size_t i = 0; i < k.n; ++i) {
          const uint64_t len = k.fixed ? k.max_len : 1 + rng() % k.max_len;
          v1::Segment g;
          g.set_source_offset(si[i] * k.slot);
          g.set_destination_offset(di[i] * k.slot);
          g.set_length(len);
          o.segments.push_back(g);
          expected.replace(g.destination_offset(), len, data, g.source_offset(), len);
          pieces.append(data, g.source_offset(), len);
        }
        auto t = client_->Move(Ref(src->id()), Ref(dst->id()), o);
        ASSERT_TRUE(t.ok()) << t.status();
        ASSERT_EQ(t->state(), v1::SUCCEEDED) << t->error_message();
        EXPECT_EQ(t->source_xxh3(), XXH3_64bits(pieces.data(), pieces.size()));
        EXPECT_EQ(t->destination_xxh3(), t->source_xxh3());
        auto after = client_->Read(Ref(dst->id()));
        ASSERT_TRUE(after.ok());
        EXPECT_TRUE(*after == expected);
        ASSERT_TRUE(client_->Release(src->id()).ok());
        ASSERT_TRUE(client_->Release(dst->id()).ok());
      }
    }
  }
}

// Prepared piece lists keep their kernel descriptors on the GPU after their first move:
// two lists (pieces past the kernel's 64 KiB cut in one) moved in turn, device -> device
// and pinned -> device, between ranges at different offsets, every destination byte
// checked each time; the daemon's --v=2 lines say the later gathers used the kept
// descriptors. A list prepared after another was released moves its own pieces.
TEST(GpuPrepared, ListsKeepTheirDescriptorsOnTheGpu) {
  auto p = DaemonProcess::Start({"--host_pool_size=256MiB", "--pinned_pool_size=256MiB",
                                 "--device_pool_size=1GiB", "--node=gpu-node", "--v=2"});
  ASSERT_TRUE(p.ok()) << p.status();
  auto c = Client::Connect((*p)->address());
  ASSERT_TRUE(c.ok());
  Client& client = **c;
  struct List {
    std::vector<v1::Segment> segments;
    std::string id;
  };
  const uint64_t slot = 200 << 10, n = 500, size = n * slot + 4096;
  auto make = [&](uint64_t seed, uint64_t max_len) {
    std::mt19937_64 rng(seed);
    std::vector<uint64_t> si(n), di(n);
    std::iota(si.begin(), si.end(), 0);
    std::iota(di.begin(), di.end(), 0);
    std::shuffle(si.begin(), si.end(), rng);
    std::shuffle(di.begin(), di.end(), rng);
    List l;
    for (size_t i = 0; i < n; ++i) {
      v1::Segment g;
      g.set_source_offset(si[i] * slot);
      g.set_destination_offset(di[i] * slot);
      g.set_length(1 + rng() % max_len);
      l.segments.push_back(g);
    }
    auto kept = client.PreparePieces(l.segments, {});
    EXPECT_TRUE(kept.ok()) << kept.status();
    if (kept.ok()) l.id = kept->id();
    return l;
  };
  List lists[2] = {make(1, 4096), make(2, slot)};
  auto dev = client.Allocate(size, v1::DEVICE, 0);
  auto pinned = client.Allocate(size, v1::PINNED_HOST, 0);
  auto dst = client.Allocate(size, v1::DEVICE, 0);
  ASSERT_TRUE(dev.ok() && pinned.ok() && dst.ok());
  const std::string data = RandomBytes(size, 3);
  ASSERT_TRUE(client.Write(Ref(dev->id()), data).ok());
  ASSERT_TRUE(client.Write(Ref(pinned->id()), data).ok());
  auto move = [&](const List& l, const std::string& from, uint64_t shift, uint64_t seed) {
    SCOPED_TRACE(absl::StrCat("list ", l.id, " shift ", shift));
    std::string expected = RandomBytes(size, seed);
    ASSERT_TRUE(client.Write(Ref(dst->id()), expected).ok());
    MoveOptions o;
    o.prepared_pieces = l.id;
    auto t = client.Move(Ref(from, shift), Ref(dst->id(), 4096 - shift), o);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ(t->state(), v1::SUCCEEDED) << t->error_message();
    for (const v1::Segment& g : l.segments) {
      expected.replace(4096 - shift + g.destination_offset(), g.length(), data,
                       shift + g.source_offset(), g.length());
    }
    EXPECT_TRUE(*client.Read(Ref(dst->id())) == expected);
  };
  uint64_t seed = 10;
  for (int round = 0; round < 3; ++round) {
    for (const List& l : lists) {
      move(l, dev->id(), round * 16, ++seed);
      move(l, pinned->id(), round * 8 + 1, ++seed);
    }
  }
  EXPECT_TRUE(absl::StrContains((*p)->Log(), "kept on the GPU")) << (*p)->Log();
  ASSERT_TRUE(client.ReleasePieces(lists[0].id).ok());
  List again = make(1, 700);  // Another list, perhaps at the first one's address.
  move(again, dev->id(), 0, ++seed);
  move(again, dev->id(), 16, ++seed);
}

// A vectored LOCAL move's list, written at its Submit where the gather kernel reads it
// (GpuRuntime::StagePieces): lists of a thousand pieces and more, one after another at
// what may be the same addresses, device -> device and pinned -> device, misaligned pieces
// of 1 B .. 4 KiB and aligned 4 KiB blocks, every destination byte checked; the daemon's
// --v=2 lines say those gathers used the descriptors written at the Submit. A list with
// pieces past the kernel's 64 KiB cut is not staged and moves as before.
TEST(GpuStaged, ListsWrittenAtTheSubmitMoveTheirPieces) {
  auto p = StartLogged();
  ASSERT_TRUE(p.ok()) << p.status();
  auto c = Client::Connect((*p)->address());
  ASSERT_TRUE(c.ok());
  Client& client = **c;
  const uint64_t size = 1100 * ((90 << 10) + 8);
  auto dev = client.Allocate(size, v1::DEVICE, 0);
  auto pinned = client.Allocate(size, v1::PINNED_HOST, 0);
  auto dst = client.Allocate(size, v1::DEVICE, 0);
  ASSERT_TRUE(dev.ok() && pinned.ok() && dst.ok());
  const std::string data = RandomBytes(size, 5);
  ASSERT_TRUE(client.Write(Ref(dev->id()), data).ok());
  ASSERT_TRUE(client.Write(Ref(pinned->id()), data).ok());
  uint64_t seed = 40;
  struct Shape {
    size_t n;
    uint64_t max_len;
    bool fixed;
  };
  for (const Shape& k : {Shape{2500, 4096, false}, Shape{2048, 4096, true},
                         Shape{1100, 90 << 10, false}, Shape{1024, 1, true}}) {
    const uint64_t slot = k.fixed ? k.max_len : k.max_len + 8;
    for (const std::string& from : {dev->id(), pinned->id(), dev->id()}) {
      ++seed;
      SCOPED_TRACE(absl::StrCat(k.n, " pieces of up to ", k.max_len, " from ", from));
      std::mt19937_64 rng(seed);
      std::vector<Piece> pieces = Shuffled(
          k.n, slot, slot, [&](size_t) { return k.fixed ? k.max_len : 1 + rng() % k.max_len; },
          seed);
      if (!k.fixed) {  // Misaligned within their slots.
        for (Piece& g : pieces) {
          g.src += rng() % 7;
          g.dst += rng() % 5;
        }
      }
      std::string expected = RandomBytes(size, seed);
      ASSERT_TRUE(client.Write(Ref(dst->id()), expected).ok());
      MoveOptions o;
      o.segments = AsSegments(pieces);
      for (const Piece& g : pieces) expected.replace(g.dst, g.len, data, g.src, g.len);
      auto t = client.Move(Ref(from), Ref(dst->id()), o);
      ASSERT_TRUE(t.ok()) << t.status();
      ASSERT_EQ(t->state(), v1::SUCCEEDED) << t->error_message();
      ASSERT_TRUE(*client.Read(Ref(dst->id())) == expected);
    }
  }
  const std::string log = (*p)->Log();
  EXPECT_TRUE(absl::StrContains(log, "descriptors written at the Submit")) << log;
}

// Pieces between device memory and a packed run of pinned memory (each piece's host side
// starts where the one before it ended, as in a staging slot) go as one DMA copy of the run
// and a gather kernel on the GPU through a device bounce: pinned -> device and device ->
// pinned, 4 KiB blocks and pieces of 1 B .. 90 KiB (past the kernel's 64 KiB cut), the run
// at a misaligned offset, every destination byte checked (the bytes around the run and
// between the device pieces untouched); the daemon's --v=2 lines say the bounce was used.
TEST(GpuBounce, PiecesToAndFromAPackedHostRunMoveEveryByte) {
  auto p = StartLogged();
  ASSERT_TRUE(p.ok()) << p.status();
  auto c = Client::Connect((*p)->address());
  ASSERT_TRUE(c.ok());
  Client& client = **c;
  struct Shape {
    size_t n;
    uint64_t max_len;
    bool fixed;
  };
  uint64_t seed = 70;
  for (const Shape& k : {Shape{2048, 4096, true}, Shape{700, 90 << 10, false}}) {
    for (const bool to_device : {true, false}) {
      ++seed;
      SCOPED_TRACE(absl::StrCat(k.n, " pieces of up to ", k.max_len,
                                to_device ? ", pinned run -> device" : ", device -> pinned run"));
      const uint64_t slot = k.max_len + 8, run_at = 4099;
      std::mt19937_64 rng(seed);
      std::vector<Piece> pieces = Shuffled(
          k.n, slot, slot, [&](size_t) { return k.fixed ? k.max_len : 1 + rng() % k.max_len; },
          seed);
      uint64_t at = run_at;
      for (Piece& g : pieces) {  // The host side packed, in list order.
        (to_device ? g.src : g.dst) = at;
        at += g.len;
      }
      const uint64_t size = k.n * slot + run_at + 64;
      auto pinned = client.Allocate(size, v1::PINNED_HOST, 0);
      auto dev = client.Allocate(size, v1::DEVICE, 0);
      ASSERT_TRUE(pinned.ok() && dev.ok());
      const std::string& from = to_device ? pinned->id() : dev->id();
      const std::string& to = to_device ? dev->id() : pinned->id();
      const std::string data = RandomBytes(size, seed);
      std::string expected = RandomBytes(size, seed + 100);
      ASSERT_TRUE(client.Write(Ref(from), data).ok());
      ASSERT_TRUE(client.Write(Ref(to), expected).ok());
      MoveOptions o;
      o.segments = AsSegments(pieces);
      for (const Piece& g : pieces) expected.replace(g.dst, g.len, data, g.src, g.len);
      auto t = client.Move(Ref(from), Ref(to), o);
      ASSERT_TRUE(t.ok()) << t.status();
      ASSERT_EQ(t->state(), v1::SUCCEEDED) << t->error_message();
      ASSERT_TRUE(*client.Read(Ref(to)) == expected);
      ASSERT_TRUE(client.Release(pinned->id()).ok());
      ASSERT_TRUE(client.Release(dev->id()).ok());
    }
  }
  const std::string log = (*p)->Log();
  EXPECT_TRUE(absl::StrContains(log, "from a host run of")) << log;
  EXPECT_TRUE(absl::StrContains(log, "to a host run of")) << log;
}

TEST_F(GpuLocal, BadDeviceRequestsAreRefused) {
  EXPECT_EQ(client_->Allocate(4096, v1::DEVICE, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Allocate(4096, v1::DEVICE, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Allocate(3ull << 30, v1::DEVICE, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto a = client_->Allocate(1536ull << 20, v1::DEVICE, 0);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(client_->Allocate(1ull << 30, v1::DEVICE, 0).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(client_->Release(a->id()).ok());
}

// --gpus by UUID (whole or a prefix naming one GPU) or index: the daemon serves that GPU
// alone, under its own index, and refuses the others; a UUID no GPU has stops the start.
TEST_F(GpuLocal, GpusSelectedByUuidOrIndex) {
  auto all = client_->GetInfo();
  ASSERT_TRUE(all.ok());
  const v1::GpuInfo last = all->gpus(all->gpus_size() - 1);
  for (const std::string& spec : {last.uuid(), last.uuid().substr(0, 12),
                                  absl::StrCat(last.index())}) {
    SCOPED_TRACE(spec);
    auto p = DaemonProcess::Start({"--gpus=" + spec, "--device_pool_size=256MiB",
                                   "--pinned_pool_size=64MiB", "--host_pool_size=64MiB",
                                   "--node=gpu-pick"});
    ASSERT_TRUE(p.ok()) << p.status();
    auto c = Client::Connect((*p)->address());
    ASSERT_TRUE(c.ok());
    auto info = (*c)->GetInfo();
    ASSERT_TRUE(info.ok());
    ASSERT_EQ(info->gpus_size(), 1);
    EXPECT_EQ(info->gpus(0).uuid(), last.uuid());
    EXPECT_EQ(info->gpus(0).index(), last.index());
    auto here = (*c)->Allocate(1 << 20, v1::DEVICE, last.index());
    ASSERT_TRUE(here.ok()) << here.status();
    const std::string data = RandomBytes(1 << 20, 5);
    ASSERT_TRUE((*c)->Write(Ref(here->id()), data).ok());
    EXPECT_TRUE(*(*c)->Read(Ref(here->id())) == data);
    if (last.index() != 0) {
      EXPECT_EQ((*c)->Allocate(1 << 20, v1::DEVICE, 0).status().code(),
                absl::StatusCode::kInvalidArgument);
    }
  }
  EXPECT_FALSE(DaemonProcess::Start({"--gpus=GPU-00000000-dead", "--node=gpu-none"}).ok());
}

TEST_F(GpuLocal, CancelStopsADeviceMove) {
  auto p = DaemonProcess::Start({"--max_move_rate=1GiB", "--device_pool_size=2GiB"});
  ASSERT_TRUE(p.ok());
  auto c = Client::Connect((*p)->address());
  ASSERT_TRUE(c.ok());
  const int last = Gpus() - 1;
  auto a = (*c)->Allocate(1ull << 30, v1::DEVICE, 0);
  auto b = (*c)->Allocate(1ull << 30, v1::DEVICE, last);
  ASSERT_TRUE(a.ok() && b.ok());
  MoveOptions o;
  o.wait = false;
  auto t = (*c)->Move(Ref(a->id()), Ref(b->id()), o);
  ASSERT_TRUE(t.ok());
  absl::SleepFor(absl::Milliseconds(150));
  ASSERT_TRUE((*c)->Cancel(t->id()).ok());
  auto end = (*c)->Wait(t->id(), absl::Seconds(10));
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(end->state(), v1::CANCELLED);
  EXPECT_LT(end->bytes_done(), 1ull << 30);
}

}  // namespace
}  // namespace gpumove
