// Vectored moves (TransferSpec.segments and .blocks) on path LOCAL with host memory:
// random piece lists of 1 B to 1 MiB, shuffled, with and without strides, every byte of
// the destination checked (the pieces' and the untouched bytes between them); bad lists
// refused with their codes and nothing written; cancel; checksums over the pieces.
#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/gpumove_client.h"
#include "gtest/gtest.h"
#include "tests/util/daemon_process.h"
#include "tests/util/pieces.h"
#include "tests/util/random_bytes.h"
#include "tests/util/test_node.h"

namespace gpumove {
namespace {

using absl::StatusCode;

class VectoredTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = DaemonProcess::Start({"--node=a", "--host_pool_size=512MiB",
                                   "--pinned_pool_size=16MiB", "--max_blocks_per_move=70000"});
    ASSERT_TRUE(d.ok()) << d.status();
    d_ = *std::move(d);
    auto c = Client::Connect(d_->address(), ConnectOptions{});
    ASSERT_TRUE(c.ok()) << c.status();
    c_ = *std::move(c);
  }
  // A source of `src_size` random bytes and a destination of `dst_size` patterned ones.
  void Buffers(uint64_t src_size, uint64_t dst_size, uint64_t seed) {
    auto s = c_->Allocate(src_size);
    auto d = c_->Allocate(dst_size);
    ASSERT_TRUE(s.ok() && d.ok());
    src_id_ = s->id();
    dst_id_ = d->id();
    src_ = RandomBytes(src_size, seed);
    dst_ = RandomBytes(dst_size, seed + 1000);
    ASSERT_TRUE(c_->Write(Ref(src_id_), src_).ok());
    ASSERT_TRUE(c_->Write(Ref(dst_id_), dst_).ok());
  }
  std::string Destination() {
    auto r = c_->Read(Ref(dst_id_));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : "";
  }

  std::unique_ptr<DaemonProcess> d_;
  std::unique_ptr<Client> c_;
  std::string src_id_, dst_id_, src_, dst_;
};

TEST_F(VectoredTest, RandomSegmentListsMoveEveryByteAndTouchNothingElse) {
  struct Case {
    size_t n;
    uint64_t max_len;
  };
  uint64_t seed = 1;
  for (const Case& k :
       {Case{1, 1}, Case{200, 1}, Case{500, 4096}, Case{64, 1 << 20}, Case{3000, 777}}) {
    ++seed;
    std::mt19937_64 rng(seed);
    const uint64_t slot = k.max_len + 3;  // Gaps between pieces that must stay untouched.
    auto pieces = Shuffled(
        k.n, slot, slot + 5, [&](size_t) { return 1 + rng() % k.max_len; }, seed);
    Buffers(k.n * slot, k.n * (slot + 5), seed);
    MoveOptions o;
    o.checksum = seed % 2 == 0;
    o.segments = AsSegments(pieces);
    auto t = c_->Move(Ref(src_id_), Ref(dst_id_), o);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ(t->state(), v1::SUCCEEDED) << t->error_message();
    uint64_t total = 0;
    for (const Piece& p : pieces) total += p.len;
    EXPECT_EQ(t->length(), total);
    EXPECT_EQ(t->bytes_done(), total);
    EXPECT_EQ(t->pieces(), k.n);
    EXPECT_EQ(t->path(), v1::LOCAL);
    if (o.checksum) {
      EXPECT_EQ(t->source_xxh3(), PiecesHash(src_, pieces));
      EXPECT_EQ(t->destination_xxh3(), t->source_xxh3());
    }
    EXPECT_TRUE(Destination() == Expected(src_, dst_, pieces)) << k.n << " pieces";
  }
}

TEST_F(VectoredTest, BlockListsWithAndWithoutStrides) {
  uint64_t seed = 100;
  for (uint64_t block : {uint64_t{1}, uint64_t{4096}, uint64_t{65536}}) {
    for (bool strides : {false, true}) {
      ++seed;
      const size_t n = block == 1 ? 5000 : block == 4096 ? 1024 : 64;
      const uint64_t ss = strides ? block * 2 + 8 : block, ds = strides ? block + 16 : block;
      auto pieces = Shuffled(
          n, ss, ds, [&](size_t) { return block; }, seed);
      Buffers(n * ss, n * ds + 100, seed);
      MoveOptions o;
      o.checksum = true;
      o.blocks.set_block_size(block);
      if (strides) {
        o.blocks.set_source_stride(ss);
        o.blocks.set_destination_stride(ds);
      }
      for (const Piece& p : pieces) {
        o.blocks.add_source_blocks(p.src / ss);
        o.blocks.add_destination_blocks(p.dst / ds);
      }
      auto t = c_->Move(Ref(src_id_), Ref(dst_id_), o);
      ASSERT_TRUE(t.ok()) << t.status();
      ASSERT_EQ(t->state(), v1::SUCCEEDED) << t->error_message();
      EXPECT_EQ(t->pieces(), n);
      EXPECT_EQ(t->source_xxh3(), PiecesHash(src_, pieces));
      EXPECT_TRUE(Destination() == Expected(src_, dst_, pieces)) << block << " " << strides;
    }
  }
  // Offsets of the ranges count: blocks relative to source offset 4096, destination 100.
  Buffers(1 << 20, 1 << 20, 7);
  MoveOptions o;
  o.blocks.set_block_size(512);
  o.blocks.add_source_blocks(3);
  o.blocks.add_destination_blocks(1);
  v1::BufferRef from = Ref(src_id_), to = Ref(dst_id_);
  from.set_offset(4096);
  to.set_offset(100);
  auto t = c_->Move(from, to, o);
  ASSERT_TRUE(t.ok() && t->state() == v1::SUCCEEDED) << t.status();
  EXPECT_EQ(t->source().offset(), 4096u + 3 * 512);  // The range holding the pieces.
  EXPECT_EQ(t->destination().offset(), 100u + 512);
  EXPECT_TRUE(Destination() == Expected(src_, dst_, {{4096 + 3 * 512, 100 + 512, 512}}));
}

// Block indices as varints (*_blocks) or fixed 32-bit integers (*_blocks32), each side in
// either form, move the same bytes; a side in both forms is refused and writes nothing.
TEST_F(VectoredTest, BlockIndicesInEitherFormMoveTheSameBytes) {
  const size_t n = 3000;
  const uint64_t block = 256;
  auto pieces = Shuffled(
      n, block, block, [&](size_t) { return block; }, 77);
  for (int form = 0; form < 4; ++form) {  // Bit 0: source 32-bit, bit 1: destination.
    Buffers(n * block, n * block, 300 + form);
    v1::SubmitRequest request;
    v1::TransferSpec* spec = request.add_transfers();
    *spec->mutable_source() = Ref(src_id_);
    *spec->mutable_destination() = Ref(dst_id_);
    v1::BlockList* b = spec->mutable_blocks();
    b->set_block_size(block);
    for (const Piece& p : pieces) {
      if (form & 1) {
        b->add_source_blocks32(static_cast<uint32_t>(p.src / block));
      } else {
        b->add_source_blocks(p.src / block);
      }
      if (form & 2) {
        b->add_destination_blocks32(static_cast<uint32_t>(p.dst / block));
      } else {
        b->add_destination_blocks(p.dst / block);
      }
    }
    request.set_wait(true);
    auto r = c_->Submit(request);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->transfers(0).state(), v1::SUCCEEDED) << r->transfers(0).error_message();
    EXPECT_EQ(r->transfers(0).pieces(), n);
    EXPECT_TRUE(Destination() == Expected(src_, dst_, pieces)) << "form " << form;
    if (form == 3) {
      // Both forms on one side: refused whole.
      Buffers(n * block, n * block, 400);
      b->add_source_blocks(0);
      auto refused = c_->Submit(request);
      EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status();
      EXPECT_TRUE(Destination() == dst_);
    }
  }
  // The client packs indices below 2^32 in the 32-bit form, and leaves bigger ones.
  v1::BlockList small, big;
  small.add_source_blocks(7);
  small.add_destination_blocks(uint64_t{1} << 32);
  CompactBlockIndices(&small);
  EXPECT_EQ(small.source_blocks32_size(), 1);
  EXPECT_EQ(small.source_blocks_size(), 0);
  EXPECT_EQ(small.destination_blocks_size(), 1);
  EXPECT_EQ(small.destination_blocks32_size(), 0);
}

TEST_F(VectoredTest, BadListsAreRefusedAndNothingIsWritten) {
  Buffers(1 << 20, 1 << 20, 9);
  auto expect = [&](StatusCode code, const MoveOptions& o, v1::BufferRef to, const char* why) {
    auto t = c_->Move(Ref(src_id_), to, o);
    EXPECT_EQ(t.status().code(), code) << why << ": " << t.status();
    EXPECT_TRUE(Destination() == dst_) << why;
  };
  auto seg = [](uint64_t s, uint64_t d, uint64_t n) {
    v1::Segment g;
    g.set_source_offset(s);
    g.set_destination_offset(d);
    g.set_length(n);
    return g;
  };
  MoveOptions o;
  o.segments = {seg(0, 0, 100), seg(200, 50, 100)};
  expect(StatusCode::kInvalidArgument, o, Ref(dst_id_), "destination pieces overlap");
  o.segments = {seg(0, 0, 100), seg(0, (1 << 20) - 10, 100)};
  expect(StatusCode::kInvalidArgument, o, Ref(dst_id_), "past the destination buffer");
  o.segments = {seg((1 << 20) - 10, 0, 100)};
  expect(StatusCode::kInvalidArgument, o, Ref(dst_id_), "past the source buffer");
  o.segments = {seg(0, 0, 0)};
  expect(StatusCode::kInvalidArgument, o, Ref(dst_id_), "an empty piece");
  o.segments = {seg(0, 1000, 100)};
  v1::BufferRef small = Ref(dst_id_);
  small.set_length(500);
  expect(StatusCode::kInvalidArgument, o, small, "past the destination range");
  o.segments = {seg(0, 0, 8)};
  o.blocks.set_block_size(8);
  o.blocks.add_source_blocks(1);
  o.blocks.add_destination_blocks(1);
  expect(StatusCode::kInvalidArgument, o, Ref(dst_id_), "segments and blocks");
  o.segments.clear();
  o.blocks.set_source_blocks(0, uint64_t{1} << 62);
  expect(StatusCode::kInvalidArgument, o, Ref(dst_id_), "index x block size past 2^64");
  o.blocks.set_source_blocks(0, 1);
  o.blocks.add_source_blocks(2);
  expect(StatusCode::kInvalidArgument, o, Ref(dst_id_), "lists of different lengths");
  MoveOptions many;
  many.blocks.set_block_size(1);
  for (int i = 0; i < 70001; ++i) {
    many.blocks.add_source_blocks(i);
    many.blocks.add_destination_blocks(i);
  }
  expect(StatusCode::kResourceExhausted, many, Ref(dst_id_), "past --max_blocks_per_move");
  // Within one buffer, pieces whose ranges overlap.
  o.blocks.Clear();
  o.segments = {seg(0, 10, 100)};
  auto t = c_->Move(Ref(src_id_), Ref(src_id_), o);
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status();
  // A batch with one bad vectored move is refused whole.
  v1::SubmitRequest batch;
  for (int i = 0; i < 2; ++i) {
    v1::TransferSpec* s = batch.add_transfers();
    *s->mutable_source() = Ref(src_id_);
    *s->mutable_destination() = Ref(dst_id_);
    *s->add_segments() = seg(0, i == 0 ? 0 : 2 << 20, 64);
  }
  EXPECT_EQ(c_->Submit(batch).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Destination() == dst_);
}

TEST_F(VectoredTest, ACancelledVectoredMoveStopsBetweenPieces) {
  d_.reset();
  auto d = DaemonProcess::Start(
      {"--node=a", "--host_pool_size=512MiB", "--pinned_pool_size=16MiB", "--max_move_rate=16MiB"});
  ASSERT_TRUE(d.ok()) << d.status();
  d_ = *std::move(d);
  auto c = Client::Connect(d_->address(), ConnectOptions{});
  ASSERT_TRUE(c.ok());
  c_ = *std::move(c);
  Buffers(256 << 20, 256 << 20, 11);
  MoveOptions o;
  o.wait = false;
  o.blocks.set_block_size(1 << 20);
  for (int i = 0; i < 256; ++i) {
    o.blocks.add_source_blocks(i);
    o.blocks.add_destination_blocks(255 - i);
  }
  auto t = c_->Move(Ref(src_id_), Ref(dst_id_), o);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::SleepFor(absl::Milliseconds(1500));
  ASSERT_TRUE(c_->Cancel(t->id()).ok());
  auto end = c_->Wait(t->id(), absl::Seconds(20));
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::CANCELLED);
  EXPECT_GT(end->bytes_done(), 0u);
  EXPECT_LT(end->bytes_done(), uint64_t{256} << 20);
}

struct Way {
  TestNode *from, *to, *via;
};
void MoveBetweenNodesAndCheck(const Way& w, const std::vector<Piece>& pieces, uint64_t src_size,
                              uint64_t dst_size, uint64_t seed) {
  auto end = [](TestNode* n) { return NodeEnd{n->client.get(), n->name}; };
  MoveVectoredAndCheck(end(w.from), end(w.to), end(w.via), v1::PATH_AUTO, v1::UCX, pieces, src_size,
                       dst_size, seed);
}

// Between nodes over UCX: pushes, pulls and a third-party move (submitted to a node that
// holds neither end), through UCX's puts and gets and through same-host direct copies,
// every byte of the destination checked. The moves are checksummed, so each hold carries
// the other node's pieces: in the fixed-width form, and in the varint pairs to a node that
// reads only those (node b of the second cluster, as nodes of earlier versions).
TEST(VectoredNodes, PushPullAndThirdPartyOverUcx) {
  for (bool direct : {false, true}) {
    const std::vector<std::string> flags = {"--host_pool_size=64MiB", "--pinned_pool_size=16MiB",
                                            absl::StrCat("--ucx_direct=", direct)};
    TestNode a = LaunchNode("a", "", flags);
    ASSERT_TRUE(a.client);
    std::vector<std::string> b_flags = flags;
    if (direct) b_flags.push_back("--peer_fixed_width_pieces=false");
    TestNode b = LaunchNode("b", a.process->address(), b_flags);
    TestNode c = LaunchNode("c", a.process->address(), flags);
    ASSERT_TRUE(b.client && c.client);
    for (TestNode* n : {&a, &b, &c}) ASSERT_TRUE(AwaitPeersUp(*n, 2).ok()) << n->name;
    uint64_t seed = direct ? 500 : 600;
    for (const Way& w : {Way{&a, &b, &a}, Way{&a, &b, &b}, Way{&b, &a, &c}}) {
      ++seed;
      SCOPED_TRACE(absl::StrCat("direct ", direct));
      std::mt19937_64 rng(seed);
      const size_t n = 2000;
      const uint64_t slot = 4099;
      // Pieces of one length (as a block list's) go with one length for all.
      const bool uniform = w.via == &b;
      auto pieces = Shuffled(
          n, slot, slot + 1, [&](size_t) { return uniform ? 4096 : 1 + rng() % 4096; }, seed);
      MoveBetweenNodesAndCheck(w, pieces, n * slot, n * (slot + 1), seed);
    }
  }
}

// Vectored moves whose far end the other node stages (--ucx_force_staging there: its
// ranges go through its bounce slots, as its device memory does with a UCX that is not
// CUDA-aware): rounds of pieces packed into its slots, scattered or gathered there in one
// call a round. Pieces longer than a slot (cut across rounds), and more tiny pieces than a
// round takes; push, pull and third party; checksums; every byte checked. Node d stages
// too but reads piece lists only as varint pairs (as nodes of earlier versions): its
// rounds' pieces come in that form, b's in the fixed-width one.
TEST(VectoredNodes, RoundsThroughTheOtherNodesBounceSlots) {
  const std::vector<std::string> common = {"--host_pool_size=64MiB", "--pinned_pool_size=16MiB"};
  TestNode a = LaunchNode("a", "", common);
  ASSERT_TRUE(a.client);
  std::vector<std::string> staged = common;
  staged.push_back("--ucx_force_staging");
  staged.push_back("--stage_chunk=1MiB");
  TestNode b = LaunchNode("b", a.process->address(), staged);
  TestNode c = LaunchNode("c", a.process->address(), common);
  std::vector<std::string> staged_varints = staged;
  staged_varints.push_back("--peer_fixed_width_pieces=false");
  TestNode d = LaunchNode("d", a.process->address(), staged_varints);
  ASSERT_TRUE(b.client && c.client && d.client);
  for (TestNode* n : {&a, &b, &c, &d}) ASSERT_TRUE(AwaitPeersUp(*n, 3).ok()) << n->name;
  struct Shape {
    size_t n;
    uint64_t slot, max_len;
  };
  uint64_t seed = 700;
  for (const Shape& k :
       {Shape{20000, 17, 16}, Shape{300, 4099, 4096}, Shape{6, (3 << 20) + 5, 3 << 20}}) {
    for (const Way& w :
         {Way{&a, &b, &a}, Way{&b, &a, &a}, Way{&a, &b, &c}, Way{&a, &d, &a}, Way{&d, &a, &a}}) {
      ++seed;
      SCOPED_TRACE(absl::StrCat("pieces of up to ", k.max_len));
      std::mt19937_64 rng(seed);
      auto pieces = Shuffled(
          k.n, k.slot, k.slot, [&](size_t) { return 1 + rng() % k.max_len; }, seed);
      MoveBetweenNodesAndCheck(w, pieces, k.n * k.slot, k.n * k.slot, seed);
    }
  }
}

}  // namespace
}  // namespace gpumove
