// The MPI thread's loop (MpiTransport::Loop): each round takes the work other threads
// queued (tasks, operations to post or cancel), hands it to MPI, notes wakes from other
// ranks, times operations out and tests them, and naps while only patient receives wait.
#ifdef GPUMOVE_HAVE_MPI

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/common/log.h"
#include "daemon/path/mpi/mpi_transport.h"
#include "daemon/path/mpi/mpi_transport_impl.h"

namespace gpumove {

using mpi_internal::MpiError;
using mpi_internal::MpiStatus;

// What the MPI thread keeps from one round to the next.
struct MpiTransport::LoopState {
  std::vector<MPI_Request> requests;
  std::vector<std::shared_ptr<Op>> ops;
  std::vector<int> indexes;
  std::vector<MPI_Status> statuses;
  // See MpiOptions::poll_window.
  absl::Time last_activity = absl::Now();
  // Wakes from other ranks (see Wake): one receive from any rank under the wake tag,
  // reposted after each. A library that fails it (a rank died) ends the wakes, and
  // patient receives then nap as they did before any wake.
  int32_t wake_buf = 0;
  MPI_Request wake = MPI_REQUEST_NULL;
  // Wakes that came before their receives were posted here (rank, tag), latest last.
  std::deque<std::pair<int, int>> early_wakes;
  absl::Time stop_deadline = absl::InfiniteFuture();
};

void MpiTransport::Loop() {
  LoopState loop;
  PostWake(loop);
  while (true) {
    std::deque<std::shared_ptr<Op>> post, cancel;
    std::deque<std::function<void()>> tasks;
    if (!TakeWork(loop, post, cancel, tasks)) break;
    if (!post.empty() || !tasks.empty()) loop.last_activity = absl::Now();
    for (auto& task : tasks) task();
    for (auto& op : post) PostOp(loop, op);
    for (auto& op : cancel) {
      for (size_t i = 0; i < loop.ops.size(); ++i) {
        if (loop.ops[i] == op) CancelAt(loop, i);
      }
    }
    TakeWakes(loop);
    if (loop.ops.empty()) {
      if (tasks.empty() && post.empty()) std::this_thread::yield();  // Polling idle.
      continue;
    }
    TimeOut(loop);
    TestOps(loop);
  }
  MPI_Finalize();
  absl::MutexLock lock(&mu_);
  finalized_ = true;
}

bool MpiTransport::NewWork() const {
  return stop_ || !to_post_.empty() || !tasks_.empty() || !to_cancel_.empty();
}

bool MpiTransport::TakeWork(LoopState& loop, std::deque<std::shared_ptr<Op>>& post,
                            std::deque<std::shared_ptr<Op>>& cancel,
                            std::deque<std::function<void()>>& tasks) {
  absl::MutexLock lock(&mu_);
  // Nothing in MPI's hands: wait for work, unless polling (see MpiOptions::spin).
  if (loop.ops.empty() &&
      !(options_.spin && absl::Now() - loop.last_activity < options_.poll_window)) {
    mu_.AwaitWithTimeout(absl::Condition(this, &MpiTransport::NewWork), absl::Milliseconds(100));
  }
  post.swap(to_post_);
  cancel.swap(to_cancel_);
  tasks.swap(tasks_);
  if (stop_ && loop.stop_deadline == absl::InfiniteFuture()) {
    loop.stop_deadline = absl::Now() + absl::Seconds(2);
    for (auto& op : loop.ops) {
      if (!op->send) cancel.push_back(op);
    }
  }
  if (stop_ && tasks.empty() && post.empty() &&
      (loop.ops.empty() || absl::Now() > loop.stop_deadline)) {
    for (auto& op : loop.ops) Finish(*op, absl::UnavailableError("daemon stopping"), 0);
    for (auto& op : post) Finish(*op, absl::UnavailableError("daemon stopping"), 0);
    StopWakes(loop);
    return false;
  }
  return true;
}

void MpiTransport::Finish(Op& op, absl::Status status, uint64_t count) {
  mu_.AssertHeld();
  op.finished = true;
  if (!op.done) {
    op.done = true;
    op.status = std::move(status);
    op.count = count;
    op.ready.store(true, std::memory_order_release);
  }
  --in_flight_;
}

void MpiTransport::PostOp(LoopState& loop, std::shared_ptr<Op>& op) {
  MPI_Request r = MPI_REQUEST_NULL;
  int count = static_cast<int>(op->n);
  MPI_Datatype type = MPI_BYTE;
  int rc = MPI_SUCCESS;
  if (!op->parts.at.empty()) {
    // One of the derived type, freed once posted (MPI keeps it for the operation).
    const Parts& p = op->parts;
    std::vector<MPI_Aint> at(p.at.begin(), p.at.end());
    rc = p.lengths.empty()
             ? MPI_Type_create_hindexed_block(static_cast<int>(at.size()),
                                              static_cast<int>(p.block), at.data(), MPI_BYTE, &type)
             : MPI_Type_create_hindexed(static_cast<int>(at.size()), p.lengths.data(), at.data(),
                                        MPI_BYTE, &type);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&type);
    count = 1;
  }
  if (rc == MPI_SUCCESS) {
    rc = op->send ? MPI_Isend(op->data, count, type, op->peer, op->tag, MPI_COMM_WORLD, &r)
                  : MPI_Irecv(op->data, count, type, op->peer, op->tag, MPI_COMM_WORLD, &r);
  }
  if (type != MPI_BYTE) MPI_Type_free(&type);
  if (rc != MPI_SUCCESS) {
    absl::MutexLock lock(&mu_);
    Finish(*op, MpiStatus(rc, op->send ? "MPI_Isend" : "MPI_Irecv"), 0);
    return;
  }
  // A wake that came first counts for every receive of its move, so it stays in the
  // list (a tag that comes round again much later at most polls where it could nap).
  if (op->patient && std::find(loop.early_wakes.begin(), loop.early_wakes.end(),
                               std::make_pair(op->peer, op->tag)) != loop.early_wakes.end()) {
    op->woken = true;
  }
  loop.requests.push_back(r);
  loop.ops.push_back(std::move(op));
}

void MpiTransport::CancelAt(LoopState& loop, size_t i) {
  if (loop.ops[i]->send || loop.ops[i]->cancel_asked) return;
  loop.ops[i]->cancel_asked = true;
  MPI_Cancel(&loop.requests[i]);
}

void MpiTransport::PostWake(LoopState& loop) {
  if (MPI_Irecv(&loop.wake_buf, sizeof(loop.wake_buf), MPI_BYTE, MPI_ANY_SOURCE, wake_tag(),
                MPI_COMM_WORLD, &loop.wake) != MPI_SUCCESS) {
    loop.wake = MPI_REQUEST_NULL;
  }
}

void MpiTransport::TakeWakes(LoopState& loop) {
  while (loop.wake != MPI_REQUEST_NULL) {
    int flag = 0;
    MPI_Status s;
    const int rc = MPI_Test(&loop.wake, &flag, &s);
    if (rc != MPI_SUCCESS) {
      LOG(WARNING) << "MPI wake receive failed (" << MpiError(rc)
                   << "); patient receives nap when idle from now on";
      loop.wake = MPI_REQUEST_NULL;
      return;
    }
    if (!flag) return;
    loop.last_activity = absl::Now();
    int found = 0;
    for (auto& op : loop.ops) {
      if (!op->send && op->patient && op->peer == s.MPI_SOURCE && op->tag == loop.wake_buf) {
        op->woken = true;
        ++found;
      }
    }
    VLOG(2) << "MPI: rank " << s.MPI_SOURCE << " starts sending tag " << loop.wake_buf << " ("
            << found << " receive(s) here)";
    if (found == 0) {
      loop.early_wakes.emplace_back(s.MPI_SOURCE, loop.wake_buf);
      if (loop.early_wakes.size() > 256) loop.early_wakes.pop_front();
    }
    PostWake(loop);
  }
}

void MpiTransport::StopWakes(LoopState& loop) {
  if (loop.wake == MPI_REQUEST_NULL) return;
  MPI_Cancel(&loop.wake);
  MPI_Wait(&loop.wake, MPI_STATUS_IGNORE);
}

void MpiTransport::TimeOut(LoopState& loop) {
  const std::vector<std::shared_ptr<Op>>& ops = loop.ops;
  // Timeouts: a receive is cancelled (and ends when MPI lets go of it); a send is
  // reported failed now and left to MPI.
  const absl::Time now = absl::Now();
  for (size_t i = 0; i < ops.size(); ++i) {
    if (now - ops[i]->posted < ops[i]->timeout) continue;
    if (!ops[i]->send) {
      CancelAt(loop, i);
    } else {
      absl::MutexLock lock(&mu_);
      if (!ops[i]->done) {
        ops[i]->done = true;
        ops[i]->ready.store(true, std::memory_order_release);
        ops[i]->status = absl::UnavailableError(
            absl::StrCat("MPI send to rank ", ops[i]->peer, " did not complete in ",
                         absl::FormatDuration(options_.op_timeout)));
      }
    }
  }
}

void MpiTransport::TestOps(LoopState& loop) {
  std::vector<std::shared_ptr<Op>>& ops = loop.ops;
  std::vector<MPI_Request>& requests = loop.requests;
  loop.indexes.resize(ops.size());
  loop.statuses.resize(ops.size());
  int completed = 0;
  const int rc = MPI_Testsome(static_cast<int>(ops.size()), requests.data(), &completed,
                              loop.indexes.data(), loop.statuses.data());
  if (completed == MPI_UNDEFINED) completed = 0;
  if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
    // The library could not say which request failed: fail them all.
    LOG(ERROR) << "MPI_Testsome: " << MpiError(rc) << "; failing " << ops.size() << " operation(s)";
    absl::MutexLock lock(&mu_);
    for (auto& op : ops) Finish(*op, MpiStatus(rc, "MPI_Testsome"), 0);
    ops.clear();
    requests.clear();
    return;
  }
  if (completed == 0) {
    NapOrPoll(loop);
    return;
  }
  loop.last_activity = absl::Now();
  FinishCompleted(loop, completed, rc);
  // Drop what completed (Testsome set their requests to MPI_REQUEST_NULL).
  size_t keep = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (requests[i] == MPI_REQUEST_NULL) continue;
    requests[keep] = requests[i];
    ops[keep++] = std::move(ops[i]);
  }
  requests.resize(keep);
  ops.resize(keep);
}

void MpiTransport::NapOrPoll(LoopState& loop) {
  // Bytes may be on their way for a send not yet timed out (one to a rank that died
  // stays with MPI), a receive of a running move, a woken patient receive.
  const bool running = std::any_of(loop.ops.begin(), loop.ops.end(), [](const auto& op) {
    return op->send ? !op->done : !op->patient || op->woken;
  });
  if (!running && absl::Now() - loop.last_activity > options_.poll_window) {
    // Long waits (a patient receive, a slow peer) nap, and new work ends the nap.
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &MpiTransport::NewWork), absl::Microseconds(50));
  } else {
    std::this_thread::yield();
  }
}

void MpiTransport::FinishCompleted(LoopState& loop, int completed, int rc) {
  absl::MutexLock lock(&mu_);
  for (int k = 0; k < completed; ++k) {
    Op& op = *loop.ops[loop.indexes[k]];
    MPI_Status& s = loop.statuses[k];
    if (rc == MPI_ERR_IN_STATUS && s.MPI_ERROR != MPI_SUCCESS) {
      Finish(op,
             absl::UnavailableError(absl::StrCat(op.send ? "send to" : "receive from", " rank ",
                                                 op.peer, ": ", MpiError(s.MPI_ERROR))),
             0);
      continue;
    }
    int cancelled = 0;
    MPI_Test_cancelled(&s, &cancelled);
    if (cancelled) {
      Finish(op, absl::CancelledError("receive cancelled"), 0);
      continue;
    }
    int count = static_cast<int>(op.n);
    if (!op.send) MPI_Get_count(&s, MPI_BYTE, &count);
    Finish(op, absl::OkStatus(), static_cast<uint64_t>(count));
  }
}

}  // namespace gpumove

#endif  // GPUMOVE_HAVE_MPI
