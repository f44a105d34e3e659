#include "daemon/cluster/peer_auth.h"

#include <fstream>

#include "gtest/gtest.h"
#include "proto/gpumove/peer/v1/peer.pb.h"

namespace gpumove {
namespace {

constexpr char kSecret[] = "0123456789abcdef0123456789abcdef";

TEST(PeerAuthTest, AStampedCallChecksOutOnceAndItsAnswerToo) {
  PeerAuth a(kSecret, "a", 11), b(kSecret, "b", 22);
  PeerAuth::Stamped s = a.Stamp(3, "body", 22);
  auto caller = b.Check(3, "body", s.stamp);
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(caller->node, "a");
  EXPECT_EQ(caller->incarnation, 11u);
  // The same call again is a replay.
  auto again = b.Check(3, "body", s.stamp);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(again.status().message().find("replayed"), std::string::npos) << again.status();
  // The answer: b signs with the call's mac, a checks against its own.
  const std::string mac = b.SignReply(caller->mac, "answer");
  EXPECT_TRUE(a.CheckReply(s.mac, "answer", mac));
  EXPECT_FALSE(a.CheckReply(s.mac, "answer!", mac));
  EXPECT_FALSE(a.CheckReply(a.Stamp(3, "body", 22).mac, "answer", mac));  // Another call's.
  EXPECT_EQ(b.refused(), 1u);
}

TEST(PeerAuthTest, WhatTheMacCoversCannotChange) {
  PeerAuth a(kSecret, "a", 11), b(kSecret, "b", 22);
  // Another body, another method.
  EXPECT_EQ(b.Check(3, "bodY", a.Stamp(3, "body", 22).stamp).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(b.Check(4, "body", a.Stamp(3, "body", 22).stamp).status().code(),
            absl::StatusCode::kUnauthenticated);
  // Any field of the stamp changed after signing.
  for (int field = 0; field < 5; ++field) {
    peer::v1::CallStamp s;
    ASSERT_TRUE(s.ParseFromString(a.Stamp(3, "body", 22).stamp));
    switch (field) {
      case 0:
        s.set_node("c");
        break;
      case 1:
        s.set_incarnation(12);
        break;
      case 2:
        s.set_to_incarnation(0);
        break;
      case 3:
        s.set_seq(s.seq() + 1000);
        break;
      case 4:
        s.set_unix_ms(s.unix_ms() + 1);
        break;
    }
    EXPECT_EQ(b.Check(3, "body", s.SerializeAsString()).status().code(),
              absl::StatusCode::kUnauthenticated)
        << "field " << field;
  }
  // No stamp, garbage, another secret.
  EXPECT_EQ(b.Check(3, "body", "").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(b.Check(3, "body", "garbage").status().code(), absl::StatusCode::kUnauthenticated);
  PeerAuth other("another secret of enough bytes", "a", 11);
  EXPECT_EQ(b.Check(3, "body", other.Stamp(3, "body", 22).stamp).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(PeerAuthTest, CallsForAnotherIncarnationAreRefusedButHelloMayNotKnowIt) {
  PeerAuth a(kSecret, "a", 11), b(kSecret, "b", 22);
  // Meant for b's previous life: refused, whatever the method.
  EXPECT_EQ(b.Check(3, "x", a.Stamp(3, "x", 21).stamp).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(b.Check(kHelloMethod, "x", a.Stamp(kHelloMethod, "x", 21).stamp).status().code(),
            absl::StatusCode::kUnauthenticated);
  // Not knowing b yet: only a Hello.
  EXPECT_EQ(b.Check(3, "x", a.Stamp(3, "x", 0).stamp).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(b.Check(kHelloMethod, "x", a.Stamp(kHelloMethod, "x", 0).stamp).ok());
}

TEST(PeerAuthTest, ClocksTooFarApartAreRefused) {
  PeerAuth a(kSecret, "a", 11), b(kSecret, "b", 22, absl::Seconds(30));
  const absl::Time now = absl::Now();
  for (absl::Duration off : {absl::Minutes(-5), absl::Seconds(-31), absl::Seconds(31)}) {
    auto st = b.Check(3, "x", a.Stamp(3, "x", 22, now + off).stamp);
    EXPECT_EQ(st.status().code(), absl::StatusCode::kUnauthenticated) << off;
    EXPECT_NE(st.status().message().find("clock"), std::string::npos) << st.status();
  }
  EXPECT_TRUE(b.Check(3, "x", a.Stamp(3, "x", 22, now - absl::Seconds(20)).stamp).ok());
  EXPECT_TRUE(b.Check(3, "x", a.Stamp(3, "x", 22, now + absl::Seconds(20)).stamp).ok());
}

// A member's call numbered past what any caller reaches is refused, saying so, and does
// not make that caller's later calls look old (it once did: "replayed (number 6 seen
// before)" for every call after a 2^64-1).
TEST(PeerAuthTest, CallNumbersNoCallerReachesAreRefusedAndPoisonNothing) {
  PeerAuth a(kSecret, "a", 11), b(kSecret, "b", 22, absl::Minutes(2), /*window=*/128);
  ASSERT_TRUE(b.Check(3, "x", a.Stamp(3, "x", 22).stamp).ok());
  for (uint64_t n : {~uint64_t{0}, kMaxCallNumber}) {
    auto st = b.Check(3, "x", a.Stamp(3, "x", 22, absl::Now(), n).stamp);
    EXPECT_EQ(st.status().code(), absl::StatusCode::kUnauthenticated) << n;
    EXPECT_NE(st.status().message().find("which no caller reaches"), std::string::npos)
        << st.status();
  }
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(b.Check(3, "x", a.Stamp(3, "x", 22).stamp).ok()) << i;
  // Too old to tell is said as such, not as a replay.
  const std::string old = a.Stamp(3, "x", 22).stamp;
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(b.Check(3, "x", a.Stamp(3, "x", 22).stamp).ok());
  auto st = b.Check(3, "x", old);
  EXPECT_NE(st.status().message().find("too old to tell"), std::string::npos) << st.status();
}

TEST(PeerAuthTest, ReplaysAreCaughtOutOfOrderAndOldNumbersRefused) {
  PeerAuth a(kSecret, "a", 11), b(kSecret, "b", 22, absl::Minutes(2), /*window=*/128);
  std::vector<std::string> stamps;
  for (int i = 0; i < 100; ++i) stamps.push_back(a.Stamp(3, "x", 22).stamp);
  // Out of order, each once: all pass; each again: all refused.
  for (int i = 99; i >= 0; i -= 2) EXPECT_TRUE(b.Check(3, "x", stamps[i]).ok()) << i;
  for (int i = 0; i < 100; i += 2) EXPECT_TRUE(b.Check(3, "x", stamps[i]).ok()) << i;
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(b.Check(3, "x", stamps[i]).ok()) << i;
  // A call numbered further below the highest seen than the window: refused (cannot tell).
  std::string old = a.Stamp(3, "x", 22).stamp;
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(b.Check(3, "x", a.Stamp(3, "x", 22).stamp).ok());
  EXPECT_FALSE(b.Check(3, "x", old).ok());
  // Another caller incarnation has numbers of its own.
  PeerAuth a2(kSecret, "a", 12);
  EXPECT_TRUE(b.Check(3, "x", a2.Stamp(3, "x", 22).stamp).ok());
}

TEST(PeerAuthTest, SecretFiles) {
  const std::string dir = testing::TempDir();
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  auto good = ReadClusterSecret(write("good", std::string(kSecret) + "\n"));
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(*good, kSecret);  // The newline is not part of it.
  EXPECT_EQ(ReadClusterSecret(write("short", "short\n")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadClusterSecret(dir + "/none").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace gpumove

namespace gpumove {
namespace {

// Rotating the secret: a node that accepts the new one takes calls signed with either;
// one that does not refuses the new one; answers are checked the same way.
TEST(PeerAuthTest, ASecondAcceptedSecretLetsTheSecretRotate) {
  constexpr char kNew[] = "fedcba9876543210fedcba9876543210";
  PeerAuth a(kSecret, "a", 11), b(kSecret, "b", 22);
  a.SetSecrets(kSecret, kNew);  // Step 1 on a: the new one accepted.
  PeerAuth::Stamped old_call = b.Stamp(3, "body", 11);
  auto from_b = a.Check(3, "body", old_call.stamp);
  ASSERT_TRUE(from_b.ok()) << from_b.status();
  b.SetSecrets(kNew, kSecret);  // Step 2 on b: signing with the new, the old accepted.
  PeerAuth::Stamped new_call = b.Stamp(3, "body", 11);
  auto again = a.Check(3, "body", new_call.stamp);
  ASSERT_TRUE(again.ok()) << again.status();
  // a's answer (old secret) is taken by b, which accepts the old one.
  EXPECT_TRUE(b.CheckReply(new_call.mac, "answer", a.SignReply(again->mac, "answer")));
  // A node that never accepted the new secret refuses its calls and answers.
  PeerAuth c(kSecret, "c", 33);
  EXPECT_EQ(c.Check(3, "body", b.Stamp(3, "body", 33).stamp).status().code(),
            absl::StatusCode::kUnauthenticated);
  PeerAuth::Stamped to_b = c.Stamp(3, "body", 22);
  auto at_b = b.Check(3, "body", to_b.stamp);
  ASSERT_TRUE(at_b.ok());
  EXPECT_FALSE(c.CheckReply(to_b.mac, "answer", b.SignReply(at_b->mac, "answer")));
  // Step 3: the old secret dropped; a call signed with it is refused.
  b.SetSecrets(kNew, "");
  EXPECT_EQ(b.Check(3, "body", c.Stamp(3, "body", 22).stamp).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(ParseClusterSecret(" \n", "f", /*may_be_empty=*/true).ok());
  EXPECT_FALSE(ParseClusterSecret(" \n", "f").ok());
  EXPECT_FALSE(ParseClusterSecret("short\n", "f", /*may_be_empty=*/true).ok());
}

}  // namespace
}  // namespace gpumove
