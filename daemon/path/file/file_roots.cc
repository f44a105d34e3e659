#include "daemon/path/file/file_roots.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"

namespace gpumove {
namespace {

// What an open beneath a root failing with `err` means to the client.
absl::Status OpenError(int err, const std::string& path) {
  const std::string what = absl::StrCat(Quoted(path), ": ", strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(absl::StrCat("no file ", what));
    case EXDEV:
      return absl::PermissionDeniedError(absl::StrCat("path escapes its root: ", what));
    case ELOOP:
      return absl::PermissionDeniedError(
          absl::StrCat("path crosses a symbolic link (refused): ", what));
    case EISDIR:
    case ENXIO:
    case ENODEV:
      return absl::PermissionDeniedError(absl::StrCat("not a regular file: ", what));
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(absl::StrCat("the daemon may not open ", what));
    case EEXIST:
      return absl::AlreadyExistsError(absl::StrCat("file exists: ", what));
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(absl::StrCat("path too long: ", what));
    default:
      return absl::InternalError(absl::StrCat("cannot open ", what));
  }
}

long Openat2(int dirfd, const char* path, uint64_t flags, uint64_t mode) {
  struct open_how how;
  memset(&how, 0, sizeof(how));
  how.flags = flags;
  how.mode = mode;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  return syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
}

// Whether this kernel has openat2 (ENOSYS: older than 5.6; EPERM: a seccomp profile).
bool HaveOpenat2(int dirfd) {
  const long fd = Openat2(dirfd, ".", O_PATH | O_DIRECTORY | O_CLOEXEC, 0);
  if (fd >= 0) {
    close(static_cast<int>(fd));
    return true;
  }
  return false;
}

}  // namespace

absl::Status CheckRelativePath(absl::string_view path) {
  if (path.empty()) return absl::InvalidArgumentError("path is empty");
  if (path.size() > kMaxFilePathBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("path is ", path.size(), " bytes; at most ", kMaxFilePathBytes));
  }
  if (path.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError("path holds a NUL byte");
  }
  if (path.front() == '/') {
    return absl::PermissionDeniedError(
        absl::StrCat("path ", Quoted(std::string(path)), " is absolute: name it from its root"));
  }
  size_t n = 0;
  for (absl::string_view c : absl::StrSplit(path, '/')) {
    if (++n > kMaxFilePathComponents) {
      return absl::InvalidArgumentError(
          absl::StrCat("path has more than ", kMaxFilePathComponents, " components"));
    }
    if (c == "..") {
      return absl::PermissionDeniedError(
          absl::StrCat("path ", Quoted(std::string(path)), " climbs out with \"..\""));
    }
    if (c.empty() || c == ".") {
      return absl::InvalidArgumentError(
          absl::StrCat("path ", Quoted(std::string(path)), " has an empty or \".\" component"));
    }
    if (c.size() > kMaxFileNameBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("a component of the path is longer than ", kMaxFileNameBytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<FileRoots>> FileRoots::Create(absl::string_view spec,
                                                             Resolve resolve) {
  std::unique_ptr<FileRoots> roots(new FileRoots());
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    Root r;
    if (absl::ConsumeSuffix(&item, ":ro")) {
      r.writable = false;
    } else {
      absl::ConsumeSuffix(&item, ":rw");
    }
    r.dir = std::string(item);
    while (r.dir.size() > 1 && r.dir.back() == '/') r.dir.pop_back();
    if (r.dir.empty() || r.dir.front() != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("--file_roots: ", Quoted(std::string(item)), " is not an absolute path"));
    }
    for (const Root& o : roots->roots_) {
      if (o.dir == r.dir) {
        return absl::InvalidArgumentError(absl::StrCat("--file_roots: ", r.dir, " given twice"));
      }
    }
    if (roots->roots_.size() >= kMaxFileRoots) {
      return absl::InvalidArgumentError(
          absl::StrCat("--file_roots: at most ", kMaxFileRoots, " roots"));
    }
    r.fd = open(r.dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (r.fd < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--file_roots: ", r.dir, " is not a directory: ", strerror(errno)));
    }
    roots->roots_.push_back(std::move(r));
  }
  if (!roots->roots_.empty()) {
    const bool have = HaveOpenat2(roots->roots_.front().fd);
    roots->openat2_ = resolve == Resolve::kOpenat2 || (resolve == Resolve::kAuto && have);
    if (resolve == Resolve::kOpenat2 && !have) {
      return absl::FailedPreconditionError("this kernel refuses openat2");
    }
    if (resolve == Resolve::kAuto && !have) {
      LOG(WARNING) << "openat2 is refused here: file paths resolve one component at a time "
                      "with O_NOFOLLOW";
    }
  }
  return roots;
}

FileRoots::~FileRoots() {
  for (Root& r : roots_) close(r.fd);
}

std::vector<std::string> FileRoots::Describe() const {
  std::vector<std::string> out;
  for (const Root& r : roots_) out.push_back(absl::StrCat(r.dir, r.writable ? ":rw" : ":ro"));
  return out;
}

absl::StatusOr<const FileRoots::Root*> FileRoots::Find(const std::string& name) const {
  if (roots_.empty()) {
    return absl::FailedPreconditionError("this node has no file roots (gpumoved --file_roots)");
  }
  if (name.empty()) {
    if (roots_.size() == 1) return &roots_.front();
    return absl::InvalidArgumentError("this node has several file roots: name one");
  }
  for (const Root& r : roots_) {
    if (r.dir == name) return &r;
  }
  return absl::NotFoundError(absl::StrCat("no file root ", Quoted(name), " on this node"));
}

absl::StatusOr<int> FileRoots::OpenBeneath(const Root& root, const std::string& path,
                                           int flags) const {
  const uint64_t mode = (flags & O_CREAT) != 0 ? 0600 : 0;
  if (openat2_) {
    const long fd = Openat2(root.fd, path.c_str(), flags, mode);
    if (fd < 0) return OpenError(errno, path);
    return static_cast<int>(fd);
  }
  // One directory at a time, none of them a symbolic link, then the file with O_NOFOLLOW.
  // CheckRelativePath has refused "..", "." and empty components already.
  std::vector<std::string> parts = absl::StrSplit(path, '/');
  int dir = root.fd;
  absl::Cleanup close_dir = [&dir, &root] {
    if (dir != root.fd) close(dir);
  };
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const int next = openat(dir, parts[i].c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) {
      int err = errno;
      struct stat st;
      if (fstatat(dir, parts[i].c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
        err = ELOOP;
      }
      return OpenError(err, path);
    }
    if (dir != root.fd) close(dir);
    dir = next;
  }
  const int fd = openat(dir, parts.back().c_str(), flags | O_NOFOLLOW, static_cast<mode_t>(mode));
  if (fd < 0) return OpenError(errno, path);
  return fd;
}

absl::StatusOr<std::shared_ptr<const FileRegion>> FileRoots::Open(
    const FileRequest& request) const {
  auto root = Find(request.root);
  if (!root.ok()) return root.status();
  if (absl::Status st = CheckRelativePath(request.path); !st.ok()) return st;
  if (request.length == 0) return absl::InvalidArgumentError("length must be greater than 0");
  if (request.offset > kMaxFileBytes || request.length > kMaxFileBytes - request.offset) {
    return absl::InvalidArgumentError(absl::StrCat("offset ", request.offset, " + length ",
                                                   request.length, " passes 2^62 bytes"));
  }
  if (request.create && !request.writable) {
    return absl::InvalidArgumentError("create is for writable regions only");
  }
  if (request.writable && !(*root)->writable) {
    return absl::PermissionDeniedError(
        absl::StrCat("file root ", (*root)->dir, " is read-only here"));
  }
  // O_NONBLOCK: a FIFO planted under the root must not hang the open (it is refused below).
  const int flags =
      (request.writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | O_NOFOLLOW;
  auto fd = OpenBeneath(**root, request.path, flags);
  bool created = false;
  // Create only what is missing; a file made between the two opens is opened as it is.
  for (int attempt = 0; attempt < 2 && !fd.ok() && request.create &&
                        fd.status().code() == absl::StatusCode::kNotFound;
       ++attempt) {
    fd = OpenBeneath(**root, request.path, flags | O_CREAT | O_EXCL);
    created = fd.ok();
    if (!fd.ok() && fd.status().code() == absl::StatusCode::kAlreadyExists) {
      fd = OpenBeneath(**root, request.path, flags);
    }
  }
  if (!fd.ok()) return fd.status();
  absl::Cleanup close_fd = [&fd] { close(*fd); };
  struct stat st;
  if (fstat(*fd, &st) != 0) {
    return absl::InternalError(absl::StrCat("fstat ", Quoted(request.path), ": ", strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::PermissionDeniedError(
        absl::StrCat(Quoted(request.path), " is not a regular file (refused)"));
  }
  if (st.st_nlink != 1) {
    return absl::PermissionDeniedError(absl::StrCat(Quoted(request.path), " has ", st.st_nlink,
                                                    " hard links (refused: one may be outside "
                                                    "the root)"));
  }
  if (!request.writable && request.offset + request.length > static_cast<uint64_t>(st.st_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "offset ", request.offset, " + length ", request.length, " runs past the end of ",
        Quoted(request.path), " (", st.st_size, " bytes); only a writable region may"));
  }
  const int fl = fcntl(*fd, F_GETFL);
  if (fl < 0 || fcntl(*fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("fcntl ", Quoted(request.path), ": ", strerror(errno)));
  }
  // The same file again with O_DIRECT, for aligned moves (-1 where the file system refuses
  // it, e.g. tmpfs): through our own descriptor, so it is the very file checked above.
  const std::string self = absl::StrCat("/proc/self/fd/", *fd);
  const int direct =
      open(self.c_str(), (request.writable ? O_RDWR : O_RDONLY) | O_DIRECT | O_CLOEXEC);
  std::move(close_fd).Cancel();
  if (created) {
    LOG(INFO) << "created " << (*root)->dir << "/" << request.path << " (mode 0600)";
  }
  return std::shared_ptr<const FileRegion>(std::make_shared<FileRegion>(
      *fd, direct, request.offset, request.length, request.writable, (*root)->dir, request.path));
}

}  // namespace gpumove
