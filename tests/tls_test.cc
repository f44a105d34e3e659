// TLS on the client port and between peers: certificates checked, plaintext and wrong CAs
// refused, client certificates required under mTLS, certificates rotated without a
// restart (a bad new pair refused, the old one kept), a cluster over mTLS.
#include "daemon/server/tls.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/gpumove_client.h"
#include "gtest/gtest.h"
#include "tests/util/daemon_process.h"
#include "tests/util/test_certs.h"

namespace gpumove {
namespace {

// Replaces `to` with a copy of `from` in one rename.
void Install(const std::string& from, const std::string& to) {
  const std::string tmp = to + ".new";
  std::filesystem::copy_file(from, tmp, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::rename(tmp, to);
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveOpenssl()) GTEST_SKIP() << "SKIPPED: no openssl command to make certificates";
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/tls_test.", getpid(), ".",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    ca_ = Make(MakeCa(dir_, "cluster-ca"));
    rogue_ca_ = Make(MakeCa(dir_, "rogue-ca"));
    node_a_ = Make(MakeCert(dir_, ca_, "node-a"));
    node_b_ = Make(MakeCert(dir_, ca_, "node-b"));
    client_ = Make(MakeCert(dir_, ca_, "client"));
    rogue_client_ = Make(MakeCert(dir_, rogue_ca_, "rogue-client"));
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  CertFiles Make(absl::StatusOr<CertFiles> c) {
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : CertFiles{};
  }
  static std::string Contents(const std::string& path) { return ReadFile(path); }

  // A client of `address` over TLS checked against `ca`, presenting `cert` when given.
  absl::StatusOr<std::unique_ptr<Client>> Tls(const std::string& address, const CertFiles& ca,
                                              const CertFiles* cert = nullptr) {
    ConnectOptions o;
    o.timeout = absl::Seconds(2);
    o.tls_ca = ca.cert;
    if (cert != nullptr) {
      o.tls_cert = cert->cert;
      o.tls_key = cert->key;
    }
    return Client::Connect(address, o);
  }
  // Whether a client that connected can also call (a refused client certificate may
  // show only at the first call).
  static bool Works(absl::StatusOr<std::unique_ptr<Client>>& c) {
    return c.ok() && (*c)->GetInfo().ok();
  }

  std::string dir_;
  CertFiles ca_, rogue_ca_, node_a_, node_b_, client_, rogue_client_;
};

TEST_F(TlsTest, KeyPairsAndCaBundlesAreChecked) {
  EXPECT_TRUE(CheckKeyPair(Contents(node_a_.cert), Contents(node_a_.key)).ok());
  absl::Status other = CheckKeyPair(Contents(node_a_.cert), Contents(node_b_.key));
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(other.message(), "not the certificate's")) << other;
  EXPECT_EQ(CheckKeyPair("not a certificate", Contents(node_a_.key)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckKeyPair(Contents(node_a_.cert), "not a key").code(),
            absl::StatusCode::kInvalidArgument);
  const CertFiles expired = Make(MakeCert(dir_, ca_, "expired", -1));
  absl::Status old = CheckKeyPair(Contents(expired.cert), Contents(expired.key));
  EXPECT_TRUE(absl::StrContains(old.message(), "expired")) << old;

  const std::string bundle = Contents(ca_.cert) + Contents(rogue_ca_.cert);
  EXPECT_TRUE(CheckCaBundle(bundle).ok());
  EXPECT_FALSE(CheckCaBundle("").ok());
  std::string broken = bundle;
  broken.replace(broken.rfind("-----END") - 20, 8, "@@@@@@@@");
  EXPECT_FALSE(CheckCaBundle(broken).ok()) << "a corrupted second certificate";
}

TEST_F(TlsTest, ServesTlsAndRefusesPlaintextAndOtherCas) {
  auto d =
      DaemonProcess::Start({"--node=a", "--tls_cert=" + node_a_.cert, "--tls_key=" + node_a_.key});
  ASSERT_TRUE(d.ok()) << d.status();
  auto good = Tls((*d)->address(), ca_);
  ASSERT_TRUE(good.ok()) << good.status();
  auto buf = (*good)->Allocate(4096);
  ASSERT_TRUE(buf.ok()) << buf.status();
  ASSERT_TRUE((*good)->Write(Ref(buf->id()), std::string(4096, 'q')).ok());
  auto back = (*good)->Read(Ref(buf->id()));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, std::string(4096, 'q'));

  auto plain = Client::Connect((*d)->address(), absl::Seconds(1));
  EXPECT_FALSE(Works(plain)) << "plaintext to a TLS port";
  auto wrong = Tls((*d)->address(), rogue_ca_);
  EXPECT_FALSE(Works(wrong)) << "a certificate another CA signed";
  ConnectOptions misnamed;
  misnamed.timeout = absl::Seconds(1);
  misnamed.tls_ca = ca_.cert;
  misnamed.tls_server_name = "somebody-else";
  auto named = Client::Connect((*d)->address(), misnamed);
  EXPECT_FALSE(Works(named)) << "a certificate for another name";
}

TEST_F(TlsTest, ClientCertificatesAreRequiredWithAClientCa) {
  auto d = DaemonProcess::Start({"--node=a", "--tls_cert=" + node_a_.cert,
                                 "--tls_key=" + node_a_.key, "--tls_client_ca=" + ca_.cert});
  ASSERT_TRUE(d.ok()) << d.status();
  auto none = Tls((*d)->address(), ca_);
  EXPECT_FALSE(Works(none)) << "no client certificate";
  auto rogue = Tls((*d)->address(), ca_, &rogue_client_);
  EXPECT_FALSE(Works(rogue)) << "a client certificate another CA signed";
  auto good = Tls((*d)->address(), ca_, &client_);
  EXPECT_TRUE(Works(good));
}

TEST_F(TlsTest, RefusesToStartWithFilesThatDoNotCheckOut) {
  for (const std::vector<std::string>& flags : std::vector<std::vector<std::string>>{
           {"--tls_cert=" + node_a_.cert, "--tls_key=" + node_b_.key},
           {"--tls_cert=" + node_a_.cert},
           {"--tls_client_ca=" + ca_.cert},
           {"--tls_cert=" + node_a_.cert, "--tls_key=" + node_a_.key,
            "--tls_client_ca=" + node_a_.key},
           {"--tls_cert=" + dir_ + "/missing.pem", "--tls_key=" + node_a_.key}}) {
    std::vector<std::string> all = {"--node=a"};
    all.insert(all.end(), flags.begin(), flags.end());
    auto d = DaemonProcess::Start(all);
    EXPECT_FALSE(d.ok()) << flags[0];
  }
}

TEST_F(TlsTest, CertificatesRotateWithoutARestartAndABadPairIsRefused) {
  // The daemon's files are the test's to replace.
  const std::string cert = dir_ + "/serving.pem", key = dir_ + "/serving.key";
  Install(node_a_.cert, cert);
  Install(node_a_.key, key);
  auto d = DaemonProcess::Start({"--node=a", "--tls_cert=" + cert, "--tls_key=" + key});
  ASSERT_TRUE(d.ok()) << d.status();
  auto before = Tls((*d)->address(), ca_);
  ASSERT_TRUE(Works(before));

  // A pair from another CA: new connections see it, old clients checking the first CA
  // no longer connect.
  const CertFiles next = Make(MakeCert(dir_, rogue_ca_, "node-a-next"));
  Install(next.key, key);
  Install(next.cert, cert);
  bool rotated = false;
  for (absl::Time end = absl::Now() + absl::Seconds(15); !rotated && absl::Now() < end;) {
    auto c = Tls((*d)->address(), rogue_ca_);
    rotated = Works(c);
    if (!rotated) absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_TRUE(rotated) << "the new certificate was not served within 15 s\n" << (*d)->Log();
  auto old_ca = Tls((*d)->address(), ca_);
  EXPECT_FALSE(Works(old_ca));

  // A key that is not the certificate's: refused and logged, the pair before kept.
  Install(node_b_.key, key);
  bool logged = false;
  for (absl::Time end = absl::Now() + absl::Seconds(10); !logged && absl::Now() < end;) {
    logged = absl::StrContains((*d)->Log(), "new TLS files refused");
    if (!logged) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(logged) << (*d)->Log();
  absl::SleepFor(absl::Seconds(3));  // Past gRPC's own look at its copy.
  auto still = Tls((*d)->address(), rogue_ca_);
  EXPECT_TRUE(Works(still)) << "the last good pair was not kept";
}

TEST_F(TlsTest, AClusterOverMutualTlsMovesBytesAndAPlaintextPeerCannotJoin) {
  const std::string secret = dir_ + "/secret";
  std::ofstream(secret) << "tls-test-cluster-secret-0123456789\n";
  auto a = DaemonProcess::Start({"--node=a", "--heartbeat=100ms", "--tls_cert=" + node_a_.cert,
                                 "--tls_key=" + node_a_.key, "--tls_client_ca=" + ca_.cert,
                                 "--cluster_secret_file=" + secret});
  ASSERT_TRUE(a.ok()) << a.status();
  // Client certificates are not peer credentials: without the secret b does not start.
  EXPECT_FALSE(
      DaemonProcess::Start({"--node=b", "--tls_cert=" + node_b_.cert, "--tls_key=" + node_b_.key,
                            "--tls_client_ca=" + ca_.cert, "--peers=" + (*a)->address()})
          .ok());
  auto b = DaemonProcess::Start({"--node=b", "--heartbeat=100ms", "--tls_cert=" + node_b_.cert,
                                 "--tls_key=" + node_b_.key, "--tls_client_ca=" + ca_.cert,
                                 "--cluster_secret_file=" + secret, "--peers=" + (*a)->address()});
  ASSERT_TRUE(b.ok()) << b.status();
  auto ca = Tls((*a)->address(), ca_, &client_);
  auto cb = Tls((*b)->address(), ca_, &client_);
  ASSERT_TRUE(ca.ok() && cb.ok());
  bool joined = false;
  for (absl::Time end = absl::Now() + absl::Seconds(20); !joined && absl::Now() < end;) {
    auto pa = (*ca)->ListPeers();
    auto pb = (*cb)->ListPeers();
    joined =
        pa.ok() && pb.ok() && pa->size() == 1 && pb->size() == 1 && (*pa)[0].up() && (*pb)[0].up();
    if (!joined) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(joined) << (*a)->Log() << (*b)->Log();

  constexpr size_t kSize = 3 << 20;
  std::string bytes(kSize, '\0');
  for (size_t i = 0; i < kSize; ++i) bytes[i] = static_cast<char>(i * 131 + 7);
  auto src = (*ca)->Allocate(kSize);
  auto dst = (*ca)->Allocate(kSize, v1::HOST, 0, absl::ZeroDuration(), "", "b");
  ASSERT_TRUE(src.ok() && dst.ok());
  ASSERT_TRUE((*ca)->Write(Ref(src->id()), bytes).ok());
  v1::BufferRef to = Ref(dst->id());
  to.set_node("b");
  auto moved = (*ca)->Move(Ref(src->id()), to, {.checksum = true});
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->state(), v1::SUCCEEDED) << moved->error_message();
  auto back = (*cb)->Read(Ref(dst->id()));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == bytes);

  // A daemon that dials in plaintext is never learned.
  auto c = DaemonProcess::Start({"--node=c", "--heartbeat=100ms", "--peers=" + (*a)->address()});
  ASSERT_TRUE(c.ok()) << c.status();
  absl::SleepFor(absl::Seconds(2));
  auto peers = (*ca)->ListPeers();
  ASSERT_TRUE(peers.ok());
  for (const auto& p : *peers) EXPECT_NE(p.node(), "c");
}

}  // namespace
}  // namespace gpumove

namespace gpumove {
namespace {

// --peer_tls_server_name: one certificate for every node, naming a service rather than
// the addresses the nodes are dialled at (Kubernetes pods: the headless Service's name,
// pod IPs unknown in advance). Without the flag a node's certificate is checked for the
// address's host and the peer is never reached; with it the cluster forms and moves.
TEST_F(TlsTest, PeersCheckedForAServiceNameInsteadOfTheirAddresses) {
  const std::string secret = dir_ + "/secret";
  std::ofstream(secret) << "tls-test-cluster-secret-0123456789\n";
  const CertFiles shared = Make(MakeCert(dir_, ca_, "peers", 2, "DNS:gpumove-peers.test"));
  const std::vector<std::string> common = {
      "--heartbeat=100ms", "--tls_cert=" + shared.cert, "--tls_key=" + shared.key,
      "--tls_client_ca=" + ca_.cert, "--cluster_secret_file=" + secret};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.end(), common.begin(), common.end());
    return more;
  };
  EXPECT_FALSE(DaemonProcess::Start({"--node=x", "--peer_tls_server_name=a.test"}).ok())
      << "a server name for peers in plaintext was taken";
  auto a = DaemonProcess::Start(with({"--node=a", "--peer_tls_server_name=gpumove-peers.test"}));
  ASSERT_TRUE(a.ok()) << a.status();
  ConnectOptions o;
  o.timeout = absl::Seconds(2);
  o.tls_ca = ca_.cert;
  o.tls_cert = shared.cert;
  o.tls_key = shared.key;
  o.tls_server_name = "gpumove-peers.test";
  auto ca = Client::Connect((*a)->address(), o);
  ASSERT_TRUE(ca.ok()) << ca.status();
  auto peer_up = [&](const std::string& node, absl::Duration within) {
    for (absl::Time end = absl::Now() + within; absl::Now() < end;) {
      auto peers = (*ca)->ListPeers();
      if (peers.ok()) {
        for (const auto& p : *peers) {
          if (p.node() == node && p.up()) return true;
        }
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    return false;
  };
  // Without the name, b checks a's certificate for 127.0.0.1 and never gets through.
  auto lost = DaemonProcess::Start(with({"--node=lost", "--peers=" + (*a)->address()}));
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_FALSE(peer_up("lost", absl::Seconds(2))) << (*lost)->Log();
  auto b = DaemonProcess::Start(with({"--node=b", "--peer_tls_server_name=gpumove-peers.test",
                                      "--peers=" + (*a)->address()}));
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(peer_up("b", absl::Seconds(20))) << (*a)->Log() << (*b)->Log();
  constexpr size_t kSize = 1 << 20;
  std::string bytes(kSize, '\0');
  for (size_t i = 0; i < kSize; ++i) bytes[i] = static_cast<char>(i * 7 + 1);
  auto src = (*ca)->Allocate(kSize);
  auto dst = (*ca)->Allocate(kSize, v1::HOST, 0, absl::ZeroDuration(), "", "b");
  ASSERT_TRUE(src.ok() && dst.ok()) << src.status() << dst.status();
  ASSERT_TRUE((*ca)->Write(Ref(src->id()), bytes).ok());
  v1::BufferRef to = Ref(dst->id());
  to.set_node("b");
  auto moved = (*ca)->Move(Ref(src->id()), to, {.checksum = true});
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->state(), v1::SUCCEEDED) << moved->error_message();
  v1::BufferRef back = Ref(dst->id());
  back.set_node("b");
  auto read = (*ca)->Read(back);  // Forwarded to b over the peers' TLS.
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(*read == bytes);
}

// Client certificates as principals (--client_cert_principals): the certificate's name is
// the caller, with its tenant and role; one it does not name is refused; and a call
// forwarded by a node (which presents its own certificate) is its caller's, asserted
// with the cluster secret.
TEST_F(TlsTest, ClientCertificatesArePrincipalsAlsoThroughAForwardingNode) {
  const CertFiles reader = Make(MakeCert(dir_, ca_, "reader-client"));
  const CertFiles stranger = Make(MakeCert(dir_, ca_, "stranger"));
  const std::string principals = dir_ + "/principals.csv";
  std::ofstream(principals) << "# identity,principal,tenant,role\n"
                               "client,alice,team-a,user\n"
                               "reader-client,rita,team-b,reader\n";
  const std::string secret = dir_ + "/secret";
  std::ofstream(secret) << "tls-test-cluster-secret-0123456789\n";
  auto flags = [&](const char* node, const CertFiles& cert) {
    return std::vector<std::string>{
        absl::StrCat("--node=", node),    "--heartbeat=100ms",
        "--tls_cert=" + cert.cert,        "--tls_key=" + cert.key,
        "--tls_client_ca=" + ca_.cert,    "--client_cert_principals=" + principals,
        "--cluster_secret_file=" + secret};
  };
  auto a = DaemonProcess::Start(flags("a", node_a_));
  ASSERT_TRUE(a.ok()) << a.status();
  std::vector<std::string> fb = flags("b", node_b_);
  fb.push_back("--peers=" + (*a)->address());
  auto b = DaemonProcess::Start(fb);
  ASSERT_TRUE(b.ok()) << b.status();

  auto alice = Tls((*a)->address(), ca_, &client_);
  ASSERT_TRUE(alice.ok()) << alice.status();
  auto info = (*alice)->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->authentication(), "client certificates");
  auto buf = (*alice)->Allocate(4096);
  ASSERT_TRUE(buf.ok()) << buf.status();
  ASSERT_TRUE((*alice)->Write(Ref(buf->id()), std::string(4096, 'a')).ok());

  // Another tenant's reader: does not see it, may not allocate.
  auto rita = Tls((*a)->address(), ca_, &reader);
  ASSERT_TRUE(rita.ok());
  EXPECT_EQ((*rita)->GetBuffer(buf->id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*rita)->Allocate(4096).status().code(), absl::StatusCode::kPermissionDenied);
  // A certificate the CA signed but the file does not name.
  auto nobody = Tls((*a)->address(), ca_, &stranger);
  ASSERT_TRUE(nobody.ok());
  auto refused = (*nobody)->GetInfo();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated) << refused.status();

  // Through b: alice's calls about a's buffer are forwarded and are alice's there.
  auto alice_b = Tls((*b)->address(), ca_, &client_);
  ASSERT_TRUE(alice_b.ok());
  bool up = false;
  for (absl::Time end = absl::Now() + absl::Seconds(20); !up && absl::Now() < end;) {
    auto peers = (*alice_b)->ListPeers();
    up = peers.ok() && peers->size() == 1 && (*peers)[0].up();
    if (!up) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(up) << (*b)->Log();
  v1::BufferRef on_a = Ref(buf->id());
  on_a.set_node("a");
  auto back = (*alice_b)->Read(on_a);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, std::string(4096, 'a'));
  auto rita_b = Tls((*b)->address(), ca_, &reader);
  ASSERT_TRUE(rita_b.ok());
  EXPECT_EQ((*rita_b)->Read(on_a).status().code(), absl::StatusCode::kNotFound);
  auto nobody_b = Tls((*b)->address(), ca_, &stranger);
  ASSERT_TRUE(nobody_b.ok());
  EXPECT_EQ((*nobody_b)->Read(on_a).status().code(), absl::StatusCode::kUnauthenticated);
  auto gone = (*alice_b)->Release(buf->id(), "a");
  EXPECT_TRUE(gone.ok()) << gone;
}

}  // namespace
}  // namespace gpumove
