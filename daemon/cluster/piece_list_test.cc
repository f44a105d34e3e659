#include "daemon/cluster/piece_list.h"

#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace gpumove {
namespace {

using Pieces = std::vector<std::pair<uint64_t, uint64_t>>;

struct Encoded {
  google::protobuf::RepeatedField<uint64_t> offsets, lengths;
  peer::v1::PieceList fixed;
};

Encoded Encode(const Pieces& p, bool fixed_width) {
  Encoded e;
  EncodePieces(
      p.size(), [&](size_t i) { return p[i].first; }, [&](size_t i) { return p[i].second; },
      fixed_width, &e.offsets, &e.lengths, &e.fixed);
  return e;
}

Pieces Decode(const PieceListView& v) {
  Pieces out;
  for (size_t i = 0; i < v.size(); ++i) out.emplace_back(v.offset(i), v.length(i));
  return out;
}

TEST(PieceList, EitherFormReadsBackTheSamePieces) {
  const Pieces mixed = {{4096, 10}, {0, 4096}, {1ull << 40, 1}, {77, 1ull << 33}};
  const Pieces uniform = {{8192, 4096}, {0, 4096}, {1ull << 40, 4096}};
  for (const Pieces& p : {mixed, uniform}) {
    for (bool fixed : {false, true}) {
      SCOPED_TRACE(fixed ? "fixed" : "varint");
      Encoded e = Encode(p, fixed);
      EXPECT_EQ(e.offsets.empty(), fixed);
      EXPECT_EQ(e.fixed.offsets().empty(), !fixed);
      auto v = PieceListView::Of(e.offsets, e.lengths, &e.fixed, 16);
      ASSERT_TRUE(v.ok()) << v.status();
      EXPECT_EQ(Decode(*v), p);
    }
  }
  // One length for a block list's pieces goes once.
  Encoded e = Encode(uniform, true);
  EXPECT_EQ(e.fixed.lengths_size(), 0);
  EXPECT_EQ(e.fixed.length(), 4096u);
  // It survives the wire.
  peer::v1::StageChunkRequest request;
  *request.mutable_pieces() = e.fixed;
  peer::v1::StageChunkRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(request.SerializeAsString()));
  auto v = PieceListView::Of(parsed.piece_offsets(), parsed.piece_lengths(), &parsed.pieces(), 16);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(Decode(*v), uniform);
}

TEST(PieceList, NoPiecesIsAnEmptyView) {
  Encoded e = Encode({}, true);
  auto v = PieceListView::Of(e.offsets, e.lengths, nullptr, 16);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->empty());
  v = PieceListView::Of(e.offsets, e.lengths, &e.fixed, 16);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->empty());
}

TEST(PieceList, BadFormsAreRefused) {
  auto refused = [](const Encoded& e, size_t max = 16) {
    auto v = PieceListView::Of(e.offsets, e.lengths, &e.fixed, max);
    return !v.ok() && v.status().code() == absl::StatusCode::kInvalidArgument;
  };
  const Pieces p = {{0, 1}, {8, 2}};
  {  // Both forms.
    Encoded e = Encode(p, true);
    e.offsets.Add(0);
    e.lengths.Add(1);
    EXPECT_TRUE(refused(e));
  }
  {  // Varint arrays of different lengths.
    Encoded e = Encode(p, false);
    e.lengths.RemoveLast();
    EXPECT_TRUE(refused(e));
  }
  {  // Fixed lengths of another count.
    Encoded e = Encode(p, true);
    e.fixed.mutable_lengths()->RemoveLast();
    EXPECT_TRUE(refused(e));
  }
  {  // Lengths per piece and for all.
    Encoded e = Encode(p, true);
    e.fixed.set_length(1);
    EXPECT_TRUE(refused(e));
  }
  {  // No lengths at all.
    Encoded e = Encode({{0, 4}, {8, 4}}, true);
    e.fixed.set_length(0);
    EXPECT_TRUE(refused(e));
  }
  {  // The fixed-width form at a node that does not read it.
    Encoded e = Encode(p, true);
    EXPECT_FALSE(PieceListView::Of(e.offsets, e.lengths, &e.fixed, 16, false).ok());
    e = Encode(p, false);
    EXPECT_TRUE(PieceListView::Of(e.offsets, e.lengths, &e.fixed, 16, false).ok());
  }
  // More than the call takes, in either form.
  EXPECT_TRUE(refused(Encode(p, true), 1));
  EXPECT_TRUE(refused(Encode(p, false), 1));
}

}  // namespace
}  // namespace gpumove
