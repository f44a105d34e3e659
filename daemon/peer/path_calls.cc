#include "daemon/peer/path_calls.h"

namespace gpumove {

absl::Status PathCalls::Register(const std::string& path, const std::string& method, bool at_once,
                                 PathCallHandler handler) {
  for (const std::string* name : {&path, &method}) {
    if (name->empty() || name->size() > kMaxName) {
      return absl::InvalidArgumentError(
          absl::StrCat("a path call's path and method name 1 to ", kMaxName, " bytes"));
    }
  }
  if (!entries_.try_emplace({path, method}, Entry{at_once, std::move(handler)}).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("path call ", path, ".", method, " is registered already"));
  }
  return absl::OkStatus();
}

const PathCalls::Entry* PathCalls::Find(absl::string_view path, absl::string_view method) const {
  // No copy of a hostile caller's long names (this may run on a UCX progress thread).
  if (path.size() > kMaxName || method.size() > kMaxName) return nullptr;
  auto it = entries_.find(std::make_pair(std::string(path), std::string(method)));
  return it == entries_.end() ? nullptr : &it->second;
}

}  // namespace gpumove
