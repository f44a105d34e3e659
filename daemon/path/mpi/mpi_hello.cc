#include "daemon/path/mpi/mpi_hello.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/path/mpi/mpi_hello.pb.h"

namespace gpumove {

MpiHello::MpiHello(int rank, uint64_t world) {
  self_.rank = rank;
  self_.world = world;
}

std::string MpiHello::Pack() const {
  peer::v1::MpiDetails d;
  d.set_rank(self_.rank);
  d.set_world(self_.world);
  return d.SerializeAsString();
}

absl::StatusOr<std::shared_ptr<const PathView>> MpiHello::Read(absl::string_view blob) const {
  peer::v1::MpiDetails d;
  if (!d.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
    return absl::InvalidArgumentError("not an MpiDetails message");
  }
  if (d.rank() < 0 || d.world() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", d.rank(), " of MPI job ", d.world(), ": no rank of a job"));
  }
  auto view = std::make_shared<MpiView>();
  view->rank = d.rank();
  view->world = d.world();
  return std::shared_ptr<const PathView>(std::move(view));
}

}  // namespace gpumove
