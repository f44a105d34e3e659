// A region of an open file that a FILE buffer names (BufferService.RegisterFile): the
// registry keeps it for the buffer's life, moves reach it through Endpoint::file. Path
// FILE_IO (daemon/path/file) opens it and moves its bytes; nothing else reads the file.
#ifndef GPUMOVE_DAEMON_CORE_FILE_REGION_H_
#define GPUMOVE_DAEMON_CORE_FILE_REGION_H_

#include <unistd.h>

#include <cstdint>
#include <string>

namespace gpumove {

class FileRegion {
 public:
  // Takes `fd` (buffered) and `direct_fd` (the same file opened O_DIRECT, or -1).
  FileRegion(int fd, int direct_fd, uint64_t offset, uint64_t length, bool writable,
             std::string root, std::string path)
      : fd_(fd),
        direct_fd_(direct_fd),
        offset_(offset),
        length_(length),
        writable_(writable),
        root_(std::move(root)),
        path_(std::move(path)) {}
  ~FileRegion() {
    if (fd_ >= 0) close(fd_);
    if (direct_fd_ >= 0) close(direct_fd_);
  }
  FileRegion(const FileRegion&) = delete;
  FileRegion& operator=(const FileRegion&) = delete;

  int fd() const { return fd_; }
  int direct_fd() const { return direct_fd_; }  // -1: the file system refused O_DIRECT.
  uint64_t offset() const { return offset_; }   // Of the buffer's first byte in the file.
  uint64_t length() const { return length_; }
  bool writable() const { return writable_; }
  const std::string& root() const { return root_; }
  const std::string& path() const { return path_; }  // Relative to root().

 private:
  const int fd_;
  const int direct_fd_;
  const uint64_t offset_;
  const uint64_t length_;
  const bool writable_;
  const std::string root_;
  const std::string path_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_CORE_FILE_REGION_H_
