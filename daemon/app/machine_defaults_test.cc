// The machine-dependent defaults, picked in one place (WithMachineDefaults).
#include "absl/time/time.h"
#include "daemon/app/daemon.h"
#include "gtest/gtest.h"

namespace gpumove {
namespace {

TEST(MachineDefaults, ASmallMachineSparesItsCpus) {
  const DaemonOptions o = WithMachineDefaults(DaemonOptions{}, 2);
  EXPECT_EQ(o.pool_spin, absl::ZeroDuration());
  EXPECT_EQ(o.ucx.peer_call_poll, absl::Microseconds(200));  // A fifth of the poll window.
  EXPECT_EQ(o.ucx.transport.call_awake, absl::ZeroDuration());
  EXPECT_EQ(o.ucx.transport.direct_threads, 1);
  EXPECT_EQ(o.ucx.transport.piece_threads, 2);  // Every CPU, as LOCAL's piece copies.
  EXPECT_EQ(o.ucx.lanes, 1);
  EXPECT_EQ(o.mpi.spin, false);
  EXPECT_FALSE(o.mpi.transport.spin);       // What the MPI transport is started with.
  EXPECT_EQ(o.serve.completion_queues, 0);  // gRPC's own.
  EXPECT_EQ(o.serve.max_pollers, 0);
}

TEST(MachineDefaults, ALargeMachinePolls) {
  const DaemonOptions o = WithMachineDefaults(DaemonOptions{}, 16);
  EXPECT_EQ(o.pool_spin, absl::Milliseconds(1));
  EXPECT_EQ(o.ucx.peer_call_poll, absl::Milliseconds(1));
  EXPECT_EQ(o.ucx.transport.call_awake, absl::Milliseconds(10));
  EXPECT_EQ(o.ucx.transport.direct_threads, 4);
  EXPECT_EQ(o.ucx.transport.piece_threads, 8);
  EXPECT_EQ(o.ucx.lanes, 2);
  EXPECT_EQ(o.mpi.spin, true);
  EXPECT_TRUE(o.mpi.transport.spin);
  const DaemonOptions big = WithMachineDefaults(DaemonOptions{}, 128);
  EXPECT_EQ(big.ucx.transport.direct_threads, 8);
  EXPECT_EQ(big.ucx.transport.piece_threads, 8);
  EXPECT_EQ(big.ucx.lanes, 4);
}

TEST(MachineDefaults, WhatWasSetStays) {
  DaemonOptions set;
  set.pool_spin = absl::ZeroDuration();
  set.ucx.peer_call_poll = absl::Microseconds(50);
  set.ucx.transport.call_awake = absl::Milliseconds(3);
  set.ucx.transport.direct_threads = 3;
  set.ucx.transport.piece_threads = 5;
  set.ucx.lanes = 1;
  set.mpi.spin = false;
  set.ucx.transport.poll_window = absl::Milliseconds(-5);  // Negative polls nothing.
  set.serve.completion_queues = 3;
  set.serve.min_pollers = 5;
  set.serve.max_pollers = 4;  // Raised to the minimum.
  const DaemonOptions o = WithMachineDefaults(set, 64);
  EXPECT_EQ(o.pool_spin, absl::ZeroDuration());
  EXPECT_EQ(o.ucx.peer_call_poll, absl::Microseconds(50));
  EXPECT_EQ(o.ucx.transport.call_awake, absl::Milliseconds(3));
  EXPECT_EQ(o.ucx.transport.direct_threads, 3);
  EXPECT_EQ(o.ucx.transport.piece_threads, 5);
  EXPECT_EQ(o.ucx.lanes, 1);
  EXPECT_EQ(o.mpi.spin, false);
  EXPECT_EQ(o.ucx.transport.poll_window, absl::ZeroDuration());
  EXPECT_EQ(o.serve.completion_queues, 3);
  EXPECT_EQ(o.serve.min_pollers, 5);
  EXPECT_EQ(o.serve.max_pollers, 5);
}

}  // namespace
}  // namespace gpumove
