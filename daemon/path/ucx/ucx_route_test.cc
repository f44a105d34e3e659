#include "daemon/path/ucx/ucx_route.h"

#include <gtest/gtest.h>

#include <string>

namespace gpumove {
namespace {

// As UCX 1.13 prints them (ucp_ep_print_info), seen here: shared memory on one host, TCP
// alone, and a Soft-RoCE endpoint (rc_verbs beside tcp).
constexpr char kShm[] = R"(#
# UCP endpoint 
#
#               peer: <no debug data>
#                 lane[0]:  3:sysv/memory.0 md[2]           -> md[2]/sysv/sysdev[255] am am_bw#0
#                 lane[1]:  4:posix/memory.0 md[3]          -> md[3]/posix/sysdev[255]
#                 lane[2]:  5:cma/memory.0 md[4]            -> md[4]/cma/sysdev[255] rma_bw#0
#
#                 am_send: 0..<egr/short>..93..<egr/bcopy>..8256..<rndv>..(inf)
#                  rma_bw: mds rndv_rkey_size 9
)";
constexpr char kTcp[] = R"(#
#                 lane[0]:  0:tcp/lo.0 md[0]                -> md[0]/tcp/sysdev[255] rma_bw#0 am am_bw#0
#                 lane[1]:  1:tcp/eth0.0 md[0]              -> md[0]/tcp/sysdev[255] rma_bw#1 wireup
)";
constexpr char kVerbs[] = R"(#
#                 lane[0]:  2:rc_verbs/rxe0:1.0 md[1]       -> md[1]/ib/sysdev[255] rma_bw#0 am am_bw#0
#                 lane[1]:  0:tcp/eth0.0 md[0]              -> md[0]/tcp/sysdev[255] wireup
)";

TEST(UcxRouteTest, CarriersAreTheLanesThatMoveData) {
  UcxRoute shm = ParseUcxRoute(kShm);
  ASSERT_EQ(shm.lanes.size(), 3u);
  EXPECT_EQ(shm.lanes[2].transport, "cma");
  EXPECT_EQ(shm.lanes[2].device, "memory");
  EXPECT_EQ(shm.lanes[0].roles, (std::vector<std::string>{"am", "am_bw#0"}));
  EXPECT_EQ(shm.Summary(), "sysv/memory,cma/memory");  // posix has no data role.
  EXPECT_TRUE(shm.Carries("shm"));
  EXPECT_FALSE(shm.Carries("rdma"));

  UcxRoute tcp = ParseUcxRoute(kTcp);
  EXPECT_EQ(tcp.Summary(), "tcp/lo,tcp/eth0");
  EXPECT_TRUE(tcp.Carries("tcp"));
  EXPECT_FALSE(tcp.Carries("rdma"));

  UcxRoute verbs = ParseUcxRoute(kVerbs);
  EXPECT_EQ(verbs.Summary(), "rc_verbs/rxe0:1");  // tcp only wires up.
  EXPECT_TRUE(verbs.Carries("rdma"));
  EXPECT_FALSE(verbs.Carries("tcp"));
}

TEST(UcxRouteTest, AnythingElseIsSkippedAndBounded) {
  EXPECT_TRUE(ParseUcxRoute("").lanes.empty());
  EXPECT_TRUE(ParseUcxRoute("lane[0]: nonsense\nlane[1]:\n# lane[2]: 1:/x.0\n").lanes.empty());
  // Lanes without roles: every lane carries.
  EXPECT_EQ(ParseUcxRoute("lane[0]: 1:tcp/eth1.0 md[0]\n").Summary(), "tcp/eth1");
  std::string many;
  for (int i = 0; i < 1000; ++i) many += "lane[0]: 1:tcp/eth0.0 md[0] -> x rma_bw#0\n";
  UcxRoute r = ParseUcxRoute(many);
  EXPECT_EQ(r.lanes.size(), 64u);
  EXPECT_EQ(r.Summary(), "tcp/eth0");
  EXPECT_TRUE(ParseUcxRoute("lane[0]: 1:tcp/" + std::string(100, 'e') + ".0 md[0]\n").lanes.empty());
}

TEST(UcxRouteTest, TransportClasses) {
  EXPECT_EQ(UcxTransportClass("rc_verbs"), "rdma");
  EXPECT_EQ(UcxTransportClass("rc_mlx5"), "rdma");
  EXPECT_EQ(UcxTransportClass("dc_mlx5"), "rdma");
  EXPECT_EQ(UcxTransportClass("ud_verbs"), "rdma");
  EXPECT_EQ(UcxTransportClass("tcp"), "tcp");
  EXPECT_EQ(UcxTransportClass("cma"), "shm");
  EXPECT_EQ(UcxTransportClass("cuda_ipc"), "cuda");
  EXPECT_EQ(UcxTransportClass("self"), "self");
  EXPECT_EQ(UcxTransportClass("sockcm"), "other");
}

}  // namespace
}  // namespace gpumove
