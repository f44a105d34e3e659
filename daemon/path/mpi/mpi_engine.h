// Path MPI: moves between ranks of one MPI job with two-sided MPI_Isend / MPI_Irecv.
//
// Each move gets a tag from its runner; its bytes go as `chunk`-byte messages in order
// under that tag, and MPI's rule that messages between two ranks with one tag are matched
// in the order they were sent makes message k chunk k. The runner's half runs in Move;
// the other node's half (PassiveHalf) is started through the peer service (StartMpi)
// once the hold exists, and posts its receives before the runner sends. A sender that
// stops early (cancel, a failed GPU copy) finishes its chunks in flight and then sends a
// zero-byte message, so a receiver never waits for bytes that will not come and a sender
// never waits for a receive that will not be posted. A receiver that wants to stop (the
// runner of a cancelled pull) asks the sender (StopMpi) and keeps receiving until that
// message arrives.
//
// Device memory goes straight to a CUDA-aware MPI; otherwise each side stages it through
// its own pinned bounce buffers with the shared staging pipeline (staging.h).
//
// Vectored moves: both sides see the move as its pieces' bytes one after another in the
// runner's list order, cut into `chunk`-byte messages. A side of host memory MPI takes
// as it is may hand each message to MPI as a derived datatype of its parts
// (MpiEngineOptions::datatypes), which MPI packs or unpacks itself; otherwise each side
// packs (sender) or unpacks (receiver) a message with one gather or scatter copy (host
// threads, or one GPU kernel) through slots of its own: pinned bounce buffers where it stages, else
// scratch buffers of the range's own kind (device memory for a CUDA-aware MPI), kept for later
// moves. A message that is one piece's bytes in memory MPI takes goes without a copy. The
// other node learns its pieces with StartMpi.
#ifndef GPUMOVE_DAEMON_PATH_MPI_ENGINE_H_
#define GPUMOVE_DAEMON_PATH_MPI_ENGINE_H_

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "daemon/core/engine.h"
#include "daemon/core/segments.h"
#include "daemon/gpu/gpu.h"
#include "daemon/memory/pool.h"
#include "daemon/path/mpi/mpi_protocol.h"
#include "daemon/path/mpi/mpi_transport.h"
#include "daemon/staging/staging.h"

namespace gpumove {

struct MpiEngineOptions {
  uint64_t chunk = 4 << 20;  // Bytes per message.
  // Bytes per message when the runner's side is device memory a CUDA-aware MPI takes
  // directly: each message is one GPU copy or one rendezvous the library pipelines.
  uint64_t device_chunk = 64 << 20;
  int window = 4;       // Messages in flight per move, each way (unstaged).
  int stage_slots = 4;  // Bounce buffers per staged side.
  // Stage every range, not only device memory (exercises staging without a GPU).
  bool force_staging = false;
  // Vectored messages as MPI derived datatypes (MPI packs and unpacks the pieces itself;
  // no slots, no copy threads) instead of packed by copy threads or the gather kernel:
  // never; always (wherever MPI takes the range as it is: host memory, and device memory
  // with a CUDA-aware MPI); or auto: host memory where every rank of the job is on this
  // host, which measured faster over shared memory and no slower over TCP
  // (docs/vectored.md); packed between hosts and for device memory, not measured there.
  enum class Datatypes { kNever, kAlways, kAuto };
  Datatypes datatypes = Datatypes::kAuto;
};

class MpiEngine : public Engine {
 public:
  // All must outlive the engine; `pinned` (may be null: no staging) lends bounce buffers;
  // `remote` starts and stops the other node's half.
  MpiEngine(MpiTransport* mpi, GpuRuntime* gpu, Pool* pinned, ClusterRemoteRanges* remote,
            MpiEngineOptions options = {})
      : mpi_(mpi), gpu_(gpu), pinned_(pinned), remote_(remote), options_(options) {}

  PathKind path() const override { return PathKind::kMpi; }
  absl::Status CanServe(const Endpoint& src, const Endpoint& dst) const override;
  // Both ranks run the same library, so the remote side stages device memory when we do.
  bool Stages(const Endpoint& src, const Endpoint& dst) const override {
    return (src.kind == MemoryKind::kDevice || dst.kind == MemoryKind::kDevice) &&
           !mpi_->world().cuda_aware;
  }
  // Whether this node stages `e` (device memory with a host-only MPI, or every range with
  // force_staging).
  bool StagesRange(const Endpoint& e) const { return Staged(e); }
  // A push's receiver starts with its hold: the tag is chosen here.
  void PrepareAsk(RemoteAsk& ask) override;
  // Tells a receiver started with the hold that nothing will come (the stop marker).
  void Abandon(const RemoteHold& hold) override;
  absl::Status Move(const Endpoint& src, const Endpoint& dst, uint64_t length,
                    MoveControl& control) override;
  bool MovesPieces(const Endpoint& src, const Endpoint& dst) const override { return true; }
  absl::Status MovePieces(const Endpoint& src, const Endpoint& dst, const Segments& pieces,
                          MoveControl& control) override;
  ~MpiEngine() override;

  // This node's half of a move run by `runner_rank`: sends `range` to it (`send`) or
  // receives into it. Returns once the first receives are posted. A `patient` receiver
  // (started with the hold, before the runner's move may run) does not time out before
  // the first bytes come. A vectored move's half gets its pieces here (`pieces`) or, with
  // `listed` > 0, as the runner's first message (SendPieceList), read and checked before
  // the half moves a byte; it then returns once that message's receive is posted, and
  // hands the list to `on_list` (if given) once read and checked. Or the pieces are
  // `known` (kept from an earlier move of the list, checked then): a receiving half posts
  // its receives at once, a sending one waits for the runner's go (SendGo) first.
  struct KnownPieces {
    std::shared_ptr<const std::vector<Segment>> pieces;
    uint64_t total = 0;  // Their bytes.
    uint64_t end = 0;    // Where the last of them ends in the range.
    // NextListSerial(), given when the list came: the moves that use it keep their
    // messages' GPU gather descriptors under it (Side.list_serial).
    uint64_t serial = 0;
  };
  using OnPieceList = std::function<void(const KnownPieces&)>;
  absl::StatusOr<std::unique_ptr<PassiveHalf>> StartPassive(
      const Endpoint& range, uint64_t length, int runner_rank, int tag, uint64_t chunk, bool send,
      bool patient = false, uint64_t listed = 0, const KnownPieces* known = nullptr,
      OnPieceList on_list = nullptr);
  // At most this many pieces in one StartMpi.
  static constexpr size_t kMaxHalfPieces = size_t{1} << 22;

  // One side of a move; `progress(done)` false asks to stop.
  struct Side {
    Endpoint local;
    uint64_t length = 0;
    int peer = 0;
    int tag = 0;
    uint64_t chunk = 0;
    std::function<bool(uint64_t)> progress;
    // A receiver started before its sender may be (with the hold): receives posted before
    // the first bytes came are not timed out.
    bool patient = false;
    // A sender whose receiver posted patient receives wakes it first (MpiTransport::Wake).
    bool wake = false;
    // Staged: the bounce ring the caller took (RingFor); null: taken here (RingOf).
    const BounceRing* ring = nullptr;
    // A vectored move: this side's pieces in list order (Segment.src = the offset in
    // `local`; `length` is their sum). Null: the whole range.
    std::shared_ptr<const std::vector<Segment>> pieces;
    // The list's serial (the runner's Segments.serial; the other node's KnownPieces.serial
    // for a list it keeps; 0: none): a kept list's messages keep their gather descriptors
    // on the GPU.
    uint64_t list_serial = 0;
  };
  // The bounce ring a staged side uses: sized to the move, alike on both ends so that
  // their messages match (whole chunks, or one of the move).
  StagingOptions RingFor(const Side& side) const {
    return SizedFor({.chunk = side.chunk, .slots = options_.stage_slots}, side.length);
  }
  // The ring a staged side uses: side.ring, or for the other node's half (side.ring null)
  // one taken into `own`, waiting up to kHalfRingWait: the runner took its own first, so
  // the ring it waits for is one a finished move's half is about to give back. Briefly: a
  // receiving half waits inside the runner's StartMpi call.
  absl::StatusOr<const BounceRing*> RingOf(const Side& side, std::optional<BounceRing>& own);
  static constexpr absl::Duration kHalfRingWait = absl::Milliseconds(500);
  // The other node's pieces as the message StartMpiRequest.piece_count announces:
  // {offset, length} pairs of 64-bit integers, sent and waited for.
  absl::Status SendPieceList(const std::vector<uint64_t>& list, int peer, int tag);
  // The go a sending half with known pieces waits for (instead of its list): one 64-bit
  // integer, kGo, under the move's tag; an empty message instead: the move will not run.
  static constexpr uint64_t kGo = 1;
  absl::Status SendGo(int peer, int tag);
  absl::Status ReceiveGo(int peer, int tag, bool patient, const std::function<void()>& posted);
  // A half's side of it: receives `count` pieces from `peer` (posted() once the receive
  // is posted), each checked against the `range` bytes held; their sum in *total. A
  // `patient` receive (a half started with the hold) is not timed out; an empty message
  // instead of the list: ABORTED, the sender stopped (the move will not run).
  absl::StatusOr<std::shared_ptr<const std::vector<Segment>>> ReceivePieceList(
      int peer, int tag, uint64_t count, uint64_t range, const std::function<void()>& posted,
      uint64_t* total, bool patient = false);
  // Sends; CANCELLED when progress asked to stop before every chunk went.
  absl::Status Send(const Side& side);
  // Receives; `posted` runs once the first receives are posted (an error from it cancels
  // them and ends the receive); `ask_stop` runs once when progress asks to stop (the
  // receive then goes on until the sender says it stopped).
  // CANCELLED when it stopped early after asking, ABORTED when the sender stopped
  // without being asked.
  absl::Status Receive(const Side& side, const std::function<absl::Status()>& posted,
                       const std::function<void()>& ask_stop);

 private:
  // Slots a vectored side packs messages in: a bounce ring's, or scratch buffers.
  struct Slots;
  absl::StatusOr<std::unique_ptr<Slots>> SlotsFor(const Side& side);
  void GiveBack(Slots& slots);
  // A vectored side's messages: message k is parts [begin[k], begin[k + 1]), each
  // {src: the offset in the side's range, dst: the offset in the message, length}; every
  // message but the last is `chunk` bytes.
  struct MessagePlan {
    std::vector<Segment> parts;
    std::vector<size_t> begin{0};
    size_t messages() const { return begin.size() - 1; }
  };
  // What both halves of a vectored move start with: their slots and messages.
  // `typed`: messages go as derived datatypes (Typed), no slots.
  struct Packing {
    std::unique_ptr<Slots> slots;
    MessagePlan plan;
    bool direct_ok = false;  // Whether a message of one piece may skip the slots.
    bool typed = false;
    size_t window = 0;  // Messages in flight.
  };
  absl::StatusOr<Packing> StartPacking(const Side& side);
  // Whether a vectored side's messages go as MPI derived datatypes (options_.datatypes).
  bool Typed(const Side& side) const;
  // Message k's parts as a derived datatype over the side's range.
  static MpiParts PartsOf(const MessagePlan& plan, size_t k);
  static MessagePlan PlanMessages(const std::vector<Segment>& pieces, uint64_t chunk);
  // Gather (`pack`) or scatter of message `k` through `slot` with one copy.
  absl::Status CopyMessage(const Side& side, const Slots& slots, char* slot,
                           const std::vector<Segment>& parts, size_t begin, size_t end,
                           uint64_t bytes, bool pack, size_t k);
  // The key message `k`'s descriptors are kept under on the GPU (GpuRuntime::CopyPieces'
  // list_serial): one per list, chunk, message and direction, none for a list without a
  // serial. Its top bit is set, so it never equals a list's own serial (a counter).
  static uint64_t MessageKey(uint64_t list_serial, uint64_t chunk, size_t k, bool pack);
  // Host threads a host message's gather or scatter is split over.
  static constexpr int kCopyThreads = 4;
  absl::Status SendPieces(const Side& side, bool* wire_failed, uint64_t* sent);
  absl::Status ReceivePieces(const Side& side, const std::function<absl::Status()>& posted,
                             const std::function<bool(uint64_t)>& progress);

  bool Staged(const Endpoint& e) const {
    return options_.force_staging || (e.kind == MemoryKind::kDevice && !mpi_->world().cuda_aware);
  }
  int NextTag();
  // Bytes per message of a move whose runner's side is (not) device memory; both halves
  // use the runner's choice (it travels with StartMpi or the hold).
  uint64_t ChunkFor(bool local_device, bool vectored) const {
    if (!local_device || options_.force_staging || !mpi_->world().cuda_aware) {
      return options_.chunk;
    }
    return std::max(options_.chunk, options_.device_chunk);
  }
  // Device scratch slots a vectored side packs in (each device_chunk bytes): the packing
  // copy of one message overlaps the library's move of the other.
  static constexpr int kDeviceScratchSlots = 2;
  absl::Status RunMove(const Endpoint& src, const Endpoint& dst, uint64_t length,
                       const Segments* pieces, MoveControl& control);

  MpiTransport* const mpi_;
  GpuRuntime* const gpu_;
  Pool* const pinned_;
  ClusterRemoteRanges* const remote_;
  const MpiEngineOptions options_;
  std::atomic<uint64_t> next_tag_{0};
  // Scratch buffers of finished vectored moves, for the next: {device, bytes, address}.
  struct Scratch {
    int device;
    uint64_t bytes;
    char* data;
  };
  void Free(const Scratch& s);
  absl::Mutex scratch_mu_;
  std::vector<Scratch> scratch_ ABSL_GUARDED_BY(scratch_mu_);
  static constexpr size_t kKeptScratch = 16;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_MPI_ENGINE_H_
