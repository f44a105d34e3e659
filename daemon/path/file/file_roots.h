// Path FILE_IO's roots: the directories an operator lets clients register files under
// (--file_roots), and the one way a client's path becomes an open file region: resolved
// beneath its root only (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, or one component
// at a time with O_NOFOLLOW where the kernel lacks openat2), a regular file with one link,
// opened without following anything. Every refusal changes nothing on disk.
#ifndef GPUMOVE_DAEMON_PATH_FILE_FILE_ROOTS_H_
#define GPUMOVE_DAEMON_PATH_FILE_FILE_ROOTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/core/file_region.h"

namespace gpumove {

// Bounds on a registered path (RegisterFileRequest.path).
inline constexpr size_t kMaxFilePathBytes = 512;
inline constexpr size_t kMaxFilePathComponents = 32;
inline constexpr size_t kMaxFileNameBytes = 255;
// Offsets and lengths stay within what off_t reaches.
inline constexpr uint64_t kMaxFileBytes = uint64_t{1} << 62;
// At most this many roots.
inline constexpr size_t kMaxFileRoots = 64;

struct FileRequest {
  std::string root;  // Empty: the only root.
  std::string path;  // Relative to the root.
  uint64_t offset = 0;
  uint64_t length = 0;
  bool writable = false;
  bool create = false;
};

// How a path resolves beneath a root.
enum class Resolve { kAuto, kOpenat2, kPerComponent };

class FileRoots {
 public:
  // `spec`: comma-separated absolute directories, each optionally ending ":ro" (files
  // under it are registered read-only) or ":rw" (the default). Empty: no roots (every
  // registration is FAILED_PRECONDITION). INVALID_ARGUMENT for a relative, missing,
  // non-directory or repeated root. `resolve` forces a resolution (tests).
  static absl::StatusOr<std::unique_ptr<FileRoots>> Create(absl::string_view spec,
                                                           Resolve resolve = Resolve::kAuto);
  ~FileRoots();
  FileRoots(const FileRoots&) = delete;
  FileRoots& operator=(const FileRoots&) = delete;

  bool empty() const { return roots_.empty(); }
  // Opens the region `request` names. INVALID_ARGUMENT (a malformed path, a bad offset or
  // length, a read-only region past the end of the file), PERMISSION_DENIED (escaping the
  // root: "..", an absolute path, a symbolic link, a special file, a file with other hard
  // links; writable under a read-only root), NOT_FOUND (no such root or file, no parent
  // directory for create), FAILED_PRECONDITION (no roots). A file it created is removed
  // again when a later check fails.
  absl::StatusOr<std::shared_ptr<const FileRegion>> Open(const FileRequest& request) const;
  // The roots, as given ("/data:ro").
  std::vector<std::string> Describe() const;
  // Whether paths resolve with openat2 (else per component).
  bool uses_openat2() const { return openat2_; }

 private:
  struct Root {
    std::string dir;
    bool writable = true;
    int fd = -1;  // O_PATH | O_DIRECTORY.
  };
  FileRoots() = default;
  absl::StatusOr<const Root*> Find(const std::string& name) const;
  // An fd for `path` beneath `root` opened with `flags` (O_CREAT | O_EXCL included when
  // creating); errno-derived status otherwise.
  absl::StatusOr<int> OpenBeneath(const Root& root, const std::string& path, int flags) const;

  std::vector<Root> roots_;
  bool openat2_ = false;
};

// INVALID_ARGUMENT or PERMISSION_DENIED for a path that no resolution should see: empty,
// too long, NUL bytes, absolute, "..", ".", empty components, too many or too long
// components.
absl::Status CheckRelativePath(absl::string_view path);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_FILE_FILE_ROOTS_H_
