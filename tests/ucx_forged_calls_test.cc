// An attacker who reaches a daemon's UCX worker (its address is in every Hello answer and
// on the wire) and speaks raw UCX: call messages with no stamp, a forged one, junk and
// valid reply addresses, and thousands of fresh reply keys. None of them may crash the
// daemon, get an answer, or leave an endpoint behind; a peer the daemon met (Hello'd, at
// the address it gave, stamped where there is a secret) is still answered. Before the
// fix, a junk reply address aborted gpumoved in ucp_ep_create (OnCallRequest → SendReply
// → GetPeer), a valid one was answered, and each new key left a ~19.5 KiB endpoint.
#include <grpcpp/grpcpp.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/gpumove_client.h"
#include "daemon/cluster/peer_auth.h"
#include "gtest/gtest.h"
#include "proto/gpumove/peer/v1/peer.grpc.pb.h"
#include "tests/util/daemon_process.h"
#include "tests/util/hello_paths.h"
#include "tests/util/test_node.h"

namespace gpumove {
namespace {

// The call channel's wire format, written down here as an attacker would (it mirrors
// daemon/path/ucx/ucx_transport_impl.h's CallRequestHeader).
constexpr unsigned kCallRequestAm = 0x6d01;
constexpr unsigned kCallReplyAm = 0x6d02;
constexpr uint32_t kCallMagic = 0x67706d31;
struct CallRequestHeader {
  uint32_t magic;
  uint32_t method;
  uint64_t call_id;
  uint32_t key_length;
  uint32_t address_length;
  uint8_t error_handling;
};
// PeerMethod::kPathCall: every call below is path UCX's "take_stage_slots", which never
// blocks.
constexpr uint32_t kPathCall = 3;
constexpr char kSecret[] = "c1u5ter-5ecret-0123456789abcdef";

// A bare UCP worker that sends call messages and counts the replies that come back.
class RawUcx {
 public:
  RawUcx() {
    ucp_config_t* config = nullptr;
    EXPECT_EQ(ucp_config_read(nullptr, nullptr, &config), UCS_OK);
    // As a daemon serving on loopback does (an address with other devices is refused in a
    // Hello, which the control below needs).
    EXPECT_EQ(ucp_config_modify(config, "NET_DEVICES", "lo"), UCS_OK);
    ucp_params_t params = {};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    EXPECT_EQ(ucp_init(&params, config, &context_), UCS_OK);
    ucp_config_release(config);
    ucp_worker_params_t wparams = {};
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
    EXPECT_EQ(ucp_worker_create(context_, &wparams, &worker_), UCS_OK);
    ucp_am_handler_param_t am = {};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am.id = kCallReplyAm;
    am.flags = UCP_AM_FLAG_WHOLE_MSG;
    am.cb = [](void* arg, const void*, size_t, void*, size_t, const ucp_am_recv_param_t*) {
      static_cast<RawUcx*>(arg)->replies_.fetch_add(1);
      return UCS_OK;
    };
    am.arg = this;
    EXPECT_EQ(ucp_worker_set_am_recv_handler(worker_, &am), UCS_OK);
    ucp_worker_attr_t attr = {};
    attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
    EXPECT_EQ(ucp_worker_query(worker_, &attr), UCS_OK);
    address_.assign(reinterpret_cast<const char*>(attr.address), attr.address_length);
    ucp_worker_release_address(worker_, attr.address);
  }
  ~RawUcx() {
    if (ep_ != nullptr) {
      ucp_request_param_t p = {};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* req = ucp_ep_close_nbx(ep_, &p);
      if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
    }
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
  }

  const std::string& address() const { return address_; }
  int replies() const { return replies_.load(); }

  void Connect(const std::string& daemon_worker) {
    ucp_ep_params_t params = {};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    params.address = reinterpret_cast<const ucp_address_t*>(daemon_worker.data());
    ASSERT_EQ(ucp_ep_create(worker_, &params, &ep_), UCS_OK);
  }

  // One call message: `key` and `reply_address` are what it claims to answer to; `body`
  // is framed with `stamp` as the daemon's peer calls are.
  void Send(const std::string& key, const std::string& reply_address, const std::string& stamp,
            const std::string& body) {
    CallRequestHeader h{};
    h.magic = kCallMagic;
    h.method = kPathCall;
    h.call_id = ++next_id_;
    h.key_length = static_cast<uint32_t>(key.size());
    h.address_length = static_cast<uint32_t>(reply_address.size());
    std::string header(reinterpret_cast<const char*>(&h), sizeof(h));
    header += key;
    header += reply_address;
    std::string framed(4, '\0');
    for (int i = 0; i < 4; ++i) framed[i] = static_cast<char>(stamp.size() >> (8 * i));
    framed += stamp;
    framed += body;
    ucp_request_param_t param = {};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_EAGER;
    void* req = ucp_am_send_nbx(ep_, kCallRequestAm, header.data(), header.size(), framed.data(),
                                framed.size(), &param);
    ASSERT_FALSE(UCS_PTR_IS_ERR(req)) << ucs_status_string(UCS_PTR_STATUS(req));
    for (int i = 0; req != nullptr && i < 10'000'000; ++i) {
      ucp_worker_progress(worker_);
      if (ucp_request_check_status(req) != UCS_INPROGRESS) {
        ucp_request_free(req);
        req = nullptr;
      }
    }
    ASSERT_EQ(req, nullptr) << "a send did not complete";
  }

  // Progresses until `want` replies came or `wait` passed.
  void Progress(absl::Duration wait, int want = 1 << 30) {
    for (const absl::Time until = absl::Now() + wait; absl::Now() < until && replies() < want;) {
      ucp_worker_progress(worker_);
    }
  }

 private:
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
  std::string address_;
  uint64_t next_id_ = 0;
  std::atomic<int> replies_{0};
};

uint64_t RssKiB(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

// A counter of n's /metrics once it reaches `want` (they are refreshed every second), or
// its value after 5 s.
double AwaitMetric(const TestNode& n, const std::string& name, double want) {
  const std::string at = n.client->GetInfo()->metrics_address();
  double v = -1;
  for (const absl::Time until = absl::Now() + absl::Seconds(5); absl::Now() < until;) {
    if ((v = MetricValue(at, name)) >= want) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return v;
}

// Hello to `n` as `from` (stamped by `auth` when given); returns n's descriptor.
peer::v1::NodeDescriptor Hello(const TestNode& n, const peer::v1::NodeDescriptor& from,
                               PeerAuth* auth) {
  auto stub = peer::v1::PeerService::NewStub(
      grpc::CreateChannel(n.process->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  peer::v1::HelloRequest request;
  *request.mutable_from() = from;
  if (auth != nullptr) {
    context.AddMetadata(kPeerStampKey,
                        auth->Stamp(kHelloMethod, request.SerializeAsString(), 0).stamp);
  }
  peer::v1::HelloResponse response;
  grpc::Status st = stub->Hello(&context, request, &response);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return response.node();
}

class UcxForgedCallsTest : public testing::TestWithParam<bool> {
 protected:
  bool with_secret() const { return GetParam(); }
  TestNode Launch() {
    std::vector<std::string> flags = {"--host_pool_size=64MiB", "--pinned_pool_size=16MiB",
                                      "--metrics_listen=127.0.0.1:0"};
    if (with_secret()) {
      const std::string path = testing::TempDir() + "/secret";
      std::ofstream(path) << kSecret << "\n";
      flags.push_back("--cluster_secret_file=" + path);
    }
    return LaunchNode("victim", "", flags);
  }
};

TEST_P(UcxForgedCallsTest, ForgedCallsGetNoAnswerNoEndpointAndNoCrash) {
  TestNode n = Launch();
  ASSERT_TRUE(n.client);
  PeerAuth member(kSecret, "mallory", 7);
  RawUcx raw;
  // Learns the daemon's worker address as anyone can: from a Hello's answer. (Without a
  // secret this Hello also makes a node "probe" known, at another incarnation than below.)
  peer::v1::NodeDescriptor probe;
  probe.set_node("probe");
  probe.set_incarnation(1);
  const peer::v1::NodeDescriptor victim = Hello(n, probe, with_secret() ? &member : nullptr);
  ASSERT_TRUE(UcxOf(victim).peer_calls()) << victim.DebugString();
  raw.Connect(UcxOf(victim).worker_address());
  peer::v1::TakeStageSlotsRequest take;
  take.set_transfer_id("t");
  peer::v1::PathCallRequest call;
  call.set_path("ucx");
  call.set_method("take_stage_slots");
  call.set_from_node("mallory");
  call.set_from_incarnation(7);
  call.set_body(take.SerializeAsString());
  const std::string body = call.SerializeAsString();
  const std::string junk(300, '\x7f');

  // No stamp, junk reply address (this aborted the daemon), then a valid one.
  raw.Send("mallory#7", junk, "", body);
  raw.Send("mallory#7", raw.address(), "", body);
  // A stamp of another secret, and the node "probe" at an incarnation it never had.
  PeerAuth other("another-secret-of-the-same-length", "mallory", 7);
  raw.Send("mallory#7", raw.address(),
           other.Stamp(kPathCall, body, victim.incarnation()).stamp, body);
  raw.Send("probe#2", raw.address(), "", body);
  if (with_secret()) {
    // A member's stamp, but from a node the daemon never met: waits for its Hello a second,
    // then is dropped too.
    raw.Send("mallory#7", raw.address(),
             member.Stamp(kPathCall, body, victim.incarnation()).stamp, body);
  }
  raw.Progress(absl::Milliseconds(1500));
  EXPECT_EQ(raw.replies(), 0);
  ASSERT_TRUE(n.client->GetInfo().ok()) << n.process->Log();

  // Thousands of fresh reply keys at a valid address: nothing may stay behind per key.
  // Warm-up first, so allocator arenas are not counted as growth.
  for (int i = 0; i < 200; ++i) raw.Send(absl::StrCat("warm", i, "#1"), raw.address(), "", body);
  raw.Progress(absl::Milliseconds(300));
  const uint64_t before = RssKiB(n.process->pid());
  for (int i = 0; i < 3000; ++i) raw.Send(absl::StrCat("key", i, "#1"), raw.address(), "", body);
  raw.Progress(absl::Milliseconds(500));
  const uint64_t after = RssKiB(n.process->pid());
  EXPECT_EQ(raw.replies(), 0);
  // Before the fix: ~19.5 KiB an endpoint, 57 MiB for these.
  EXPECT_LT(after, before + 12 * 1024) << "RSS " << before << " KiB -> " << after << " KiB";
  ASSERT_TRUE(n.client->GetInfo().ok()) << n.process->Log();
  EXPECT_GE(AwaitMetric(n, "ucx_peer_calls_refused_total", 3204), 3204);

  // The control: once "mallory" said Hello with this worker's address, the same call is
  // answered (stamped where there is a secret).
  peer::v1::NodeDescriptor me;
  me.set_node("mallory");
  me.set_incarnation(7);
  me.set_address("127.0.0.1:9");
  peer::v1::UcxDetails my_ucx;
  my_ucx.set_peer_calls(true);
  my_ucx.set_worker_address(raw.address());
  SetUcx(me, my_ucx);
  Hello(n, me, with_secret() ? &member : nullptr);
  const std::string stamp =
      with_secret() ? member.Stamp(kPathCall, body, victim.incarnation()).stamp : "";
  raw.Send("mallory#7", raw.address(), stamp, body);
  raw.Progress(absl::Seconds(5), 1);
  EXPECT_EQ(raw.replies(), 1) << "a met peer's call was not answered";
  // Met, but the reply key names another incarnation than the stamp or the Hello: dropped.
  raw.Send("mallory#8", raw.address(), stamp, body);
  raw.Progress(absl::Milliseconds(1500), 2);
  EXPECT_EQ(raw.replies(), 1);
  ASSERT_TRUE(n.client->GetInfo().ok()) << n.process->Log();
}

INSTANTIATE_TEST_SUITE_P(SecretOrNot, UcxForgedCallsTest, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& p) {
                           return p.param ? "WithClusterSecret" : "Open";
                         });

}  // namespace
}  // namespace gpumove
