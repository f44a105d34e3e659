// Hold planning for the scheduler: checks the moves of one Submit, holds their ranges
// (local ones in the registry, those on other nodes with one RemoteRanges::PrepareMany
// per node and phase, nodes in parallel) and picks each move's engine. Internal to the
// scheduler; it keeps no state of its own and takes none of the scheduler's locks.
#ifndef GPUMOVE_DAEMON_CORE_HOLD_PLANNER_H_
#define GPUMOVE_DAEMON_CORE_HOLD_PLANNER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/core/buffer_registry.h"
#include "daemon/core/engine.h"
#include "daemon/core/transfer_record.h"
#include "daemon/core/transfer_scheduler.h"

namespace gpumove {

class HoldPlanner {
 public:
  // Everything must outlive the planner (the scheduler owns all of it); `remote` null:
  // this node has no peers. Engines are tried in order for PATH_AUTO.
  HoldPlanner(const SchedulerOptions& options, BufferRegistry* registry,
              const std::vector<Engine*>& engines, RemoteRanges* remote)
      : options_(options), registry_(registry), engines_(engines), remote_(remote) {}
  HoldPlanner(const HoldPlanner&) = delete;
  HoldPlanner& operator=(const HoldPlanner&) = delete;

  // Checks moves and holds their ranges (locally, or on other nodes through `remote`);
  // one result per spec. A move refused after its hold on another node was taken lets
  // that hold go.
  std::vector<absl::StatusOr<std::shared_ptr<TransferRecord>>> PrepareAll(
      const std::string& owner, const std::vector<TransferSpec>& specs) const;

  // Lets go of a hold whose move never ran (engines first undo what they started there).
  // It may call the other node and wait (an MPI engine's Abandon does), so never under
  // the scheduler's lock.
  void ReleaseUnrun(const RemoteHold& hold) const;

 private:
  // One move while it is planned: its record once its spec checks out, else the error.
  struct Draft;

  static std::string BufferKey(const RangeSpec& r);
  // A vectored move holds the smallest ranges holding its pieces: narrows `specs` to
  // those, with an error in `bad` for a move whose pieces do not fit.
  void BoundPieces(std::vector<TransferSpec>& specs, std::vector<absl::Status>& bad) const;
  // Checks what can be checked of a spec before any hold; `bad` is BoundPieces' error.
  Draft NewDraft(const std::string& owner, const TransferSpec& spec, const absl::Status& bad) const;
  void HoldLocal(const std::string& owner, Draft& d, const RangeSpec& r, uint64_t length,
                 bool write) const;
  // Holds the remote ends asked for in one phase (sources: `write` false; destinations:
  // true): one batch per node, nodes in parallel.
  void HoldRemote(const std::string& owner, const std::vector<TransferSpec>& specs,
                  std::vector<Draft>& drafts, bool write) const;
  // One node's batch of HoldRemote: the moves `idx` of `drafts`.
  void HoldOn(const std::string& owner, const std::vector<TransferSpec>& specs,
              std::vector<Draft>& drafts, const std::string& node, const std::vector<size_t>& idx,
              bool write) const;
  // The checks that need both ends held, and the engine.
  void Settle(const TransferSpec& spec, Draft& d) const;
  absl::StatusOr<Engine*> ChooseEngine(PathKind path, const Endpoint& src, const Endpoint& dst,
                                       bool pieces) const;

  const SchedulerOptions& options_;
  BufferRegistry* const registry_;
  const std::vector<Engine*>& engines_;
  RemoteRanges* const remote_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_CORE_HOLD_PLANNER_H_
