// A node's Hello blobs as a test reads and forges them (NodeDescriptor.paths): the UCX
// details are only reachable as a path's blob now.
#ifndef GPUMOVE_TESTS_UTIL_HELLO_PATHS_H_
#define GPUMOVE_TESTS_UTIL_HELLO_PATHS_H_

#include <string>

#include "daemon/path/ucx/ucx_hello.pb.h"
#include "proto/gpumove/peer/v1/peer.pb.h"

namespace gpumove {

// `path`'s blob in `d`; empty when it has none.
inline std::string PathBlob(const peer::v1::NodeDescriptor& d, const std::string& path) {
  for (const peer::v1::PathDetails& p : d.paths()) {
    if (p.path() == path) return p.details();
  }
  return "";
}

// Sets (or adds) `path`'s blob in `d`.
inline void SetPathBlob(peer::v1::NodeDescriptor& d, const std::string& path, std::string blob) {
  for (peer::v1::PathDetails& p : *d.mutable_paths()) {
    if (p.path() == path) {
      p.set_details(std::move(blob));
      return;
    }
  }
  peer::v1::PathDetails* p = d.add_paths();
  p->set_path(path);
  p->set_details(std::move(blob));
}

// `d`'s UCX details (empty when it has no UCX engine).
inline peer::v1::UcxDetails UcxOf(const peer::v1::NodeDescriptor& d) {
  peer::v1::UcxDetails u;
  u.ParseFromString(PathBlob(d, "ucx"));
  return u;
}

inline void SetUcx(peer::v1::NodeDescriptor& d, const peer::v1::UcxDetails& u) {
  SetPathBlob(d, "ucx", u.SerializeAsString());
}

}  // namespace gpumove

#endif  // GPUMOVE_TESTS_UTIL_HELLO_PATHS_H_
