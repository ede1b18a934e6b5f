#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "storage/storage_env.hpp"

namespace cairn::storage {
namespace {

// Process-wide counts of the file system operations (posix_io_counters).
struct counters {
  std::atomic<uint64_t> creates{0}, opens{0}, syncs{0}, renames{0}, dir_syncs{0}, mkdirs{0}, removes{0},
      bytes_written{0};
};
counters g_counters;

class posix_writable final : public writable_file {
 public:
  posix_writable(int fd, std::string path, bool direct) : fd_(fd), path_(std::move(path)), direct_(direct) {}
  ~posix_writable() override { (void)close(); }

  status write_at(uint64_t offset, const void* data, size_t len) override {
    g_counters.bytes_written.fetch_add(len, std::memory_order_relaxed);
    const char* p = static_cast<const char*>(data);
    while (len > 0) {
      // Bounded chunks: large pwrite calls can return short on some systems.
      size_t chunk = len < (size_t{1} << 30) ? len : (size_t{1} << 30);
      ssize_t n = ::pwrite(fd_, p, chunk, static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EINVAL && direct_) {
          // The file system accepted O_DIRECT at open but not this transfer:
          // continue buffered (the final sync still makes it durable).
          int fl = fcntl(fd_, F_GETFL);
          if (fl >= 0 && fcntl(fd_, F_SETFL, fl & ~O_DIRECT) == 0) { direct_ = false; continue; }
        }
        return status::from_errno(errno, "write of " + std::to_string(chunk) + " bytes at offset " +
                                             std::to_string(offset) + " to " + path_);
      }
      if (n == 0) return status::from_errno(EIO, "write returned 0 for " + path_);
      p += n;
      len -= static_cast<size_t>(n);
      offset += static_cast<uint64_t>(n);
    }
    return {};
  }

  status sync() override {
    g_counters.syncs.fetch_add(1, std::memory_order_relaxed);
    while (::fdatasync(fd_) != 0) {
      if (errno == EINTR) continue;
      return status::from_errno(errno, "fdatasync of " + path_);
    }
    return {};
  }

  status close() override {
    if (fd_ < 0) return {};
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0 && errno != EINTR) return status::from_errno(errno, "close of " + path_);
    return {};
  }

  bool direct() const override { return direct_; }

 private:
  int fd_;
  std::string path_;
  bool direct_;
};

class posix_readable final : public readable_file {
 public:
  posix_readable(int fd, std::string path, uint64_t size) : fd_(fd), path_(std::move(path)), size_(size) {}
  ~posix_readable() override {
    if (map_) ::munmap(map_, size_);
    if (direct_fd_ >= 0) ::close(direct_fd_);
    ::close(fd_);
  }

  status read_at(uint64_t offset, void* data, size_t len) const override {
    char* p = static_cast<char*>(data);
    // Large reads whose offset, length and buffer are page-aligned (a shard
    // image's data into a staging-like buffer, at restart) bypass the page
    // cache: no copy through it, no cache pages allocated for bytes read once.
    if (len >= kDirectMin && aligned(offset) && aligned(len) && aligned(reinterpret_cast<uintptr_t>(p)) &&
        direct_fd() >= 0) {
      while (len > 0) {
        ssize_t n = ::pread(direct_fd_, p, len, static_cast<off_t>(offset));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0 || !aligned(static_cast<uint64_t>(n))) break;  // the rest buffered (short tail, refusal)
        p += n;
        len -= static_cast<size_t>(n);
        offset += static_cast<uint64_t>(n);
      }
    }
    while (len > 0) {
      ssize_t n = ::pread(fd_, p, len, static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        return status::from_errno(errno, "read at offset " + std::to_string(offset) + " of " + path_);
      }
      if (n == 0) {
        return {errc::corruption, path_ + " is shorter than expected (truncated at " + std::to_string(offset) + ")"};
      }
      p += n;
      len -= static_cast<size_t>(n);
      offset += static_cast<uint64_t>(n);
    }
    return {};
  }
  uint64_t size() const override { return size_; }

  static constexpr size_t kDirectMin = 1 << 20;
  static bool aligned(uint64_t v) { return v % 4096 == 0; }
  // A second descriptor with O_DIRECT, opened at the first large aligned
  // read (reads may run in parallel); -1 where the file system refuses it
  // (tmpfs, some FUSE mounts).
  int direct_fd() const {
    std::call_once(direct_once_, [this] { direct_fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT); });
    return direct_fd_;
  }

  std::span<const std::byte> map() override {
    if (!map_ && size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED | MAP_POPULATE, fd_, 0);
      if (p == MAP_FAILED) return {};
      map_ = p;
    }
    return {static_cast<const std::byte*>(map_), map_ ? size_ : 0};
  }

 private:
  int fd_;
  std::string path_;
  uint64_t size_;
  void* map_ = nullptr;
  mutable std::once_flag direct_once_;
  mutable int direct_fd_ = -1;
};

class posix_mapped final : public mapped_file {
 public:
  posix_mapped(void* p, size_t n, dev_t dev, ino_t ino) : p_(p), n_(n), dev_(dev), ino_(ino) {}
  ~posix_mapped() override { ::munmap(p_, n_); }
  std::span<std::byte> bytes() override { return {static_cast<std::byte*>(p_), n_}; }
  bool is(const std::string& path) const override {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_;
  }

 private:
  void* p_;
  size_t n_;
  dev_t dev_;
  ino_t ino_;
};

class posix_env final : public storage_env {
 public:
  result<std::unique_ptr<mapped_file>> map_shared(const std::string& path) override {
    g_counters.opens.fetch_add(1, std::memory_order_relaxed);
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return status::from_errno(errno, "open " + path);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      return status::from_errno(e, "stat " + path);
    }
    if (st.st_size <= 0) {
      ::close(fd);
      return status(errc::not_supported, path + ": an empty file is not mapped");
    }
    void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                     fd, 0);
    const int e = errno;
    ::close(fd);  // the mapping keeps the file
    if (p == MAP_FAILED) return status::from_errno(e, "mmap " + path);
    return std::unique_ptr<mapped_file>(new posix_mapped(p, static_cast<size_t>(st.st_size), st.st_dev, st.st_ino));
  }

  result<std::unique_ptr<writable_file>> create(const std::string& path, bool want_direct, bool truncate) override {
    g_counters.creates.fetch_add(1, std::memory_order_relaxed);
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (truncate ? O_TRUNC : 0);
    int fd = -1;
    bool direct = false;
    if (want_direct) {
      fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
      direct = fd >= 0;
      if (fd < 0 && errno != EINVAL) return status::from_errno(errno, "create " + path);
    }
    if (fd < 0) fd = ::open(path.c_str(), flags, 0644);
    if (fd < 0) return status::from_errno(errno, "create " + path);
    return std::unique_ptr<writable_file>(new posix_writable(fd, path, direct));
  }

  result<std::unique_ptr<readable_file>> open_read(const std::string& path) override {
    g_counters.opens.fetch_add(1, std::memory_order_relaxed);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return status(errc::not_found, path + " does not exist");
      return status::from_errno(errno, "open " + path);
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      int e = errno;
      ::close(fd);
      return status::from_errno(e, "stat " + path);
    }
    return std::unique_ptr<readable_file>(new posix_readable(fd, path, static_cast<uint64_t>(st.st_size)));
  }

  status rename(const std::string& from, const std::string& to) override {
    g_counters.renames.fetch_add(1, std::memory_order_relaxed);
    if (::rename(from.c_str(), to.c_str()) != 0) return status::from_errno(errno, "rename " + from + " to " + to);
    return {};
  }

  status sync_dir(const std::string& dir) override {
    g_counters.dir_syncs.fetch_add(1, std::memory_order_relaxed);
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return status::from_errno(errno, "open directory " + dir);
    int rc = ::fsync(fd);
    int e = errno;
    ::close(fd);
    // Some file systems (tmpfs) refuse fsync on directories: nothing to make durable.
    if (rc != 0 && e != EINVAL && e != EROFS) return status::from_errno(e, "fsync directory " + dir);
    return {};
  }

  status make_dirs(const std::string& dir) override {
    if (dir.empty()) return {};
    // Up to the deepest directory that exists (usually the parent), then one
    // mkdir per missing component: on a parallel file system every mkdir is
    // a metadata request, even of a directory that exists.
    std::vector<std::string> missing;
    std::string cur = dir;
    while (!cur.empty() && cur != "/") {
      struct stat st {};
      if (::stat(cur.c_str(), &st) == 0) {
        if (!S_ISDIR(st.st_mode)) return {errc::io_error, cur + " exists and is not a directory"};
        break;
      }
      missing.push_back(cur);
      const size_t slash = cur.find_last_of('/');
      cur = slash == std::string::npos ? std::string() : cur.substr(0, slash);
    }
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
      g_counters.mkdirs.fetch_add(1, std::memory_order_relaxed);
      if (::mkdir(it->c_str(), 0755) != 0 && errno != EEXIST) return status::from_errno(errno, "mkdir " + *it);
    }
    // Each new entry made durable in its parent (docs/format/store.md): a
    // power loss must not drop a directory a commit names. Also where another
    // process won the race to create it: it may not have synced it yet.
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
      const size_t slash = it->find_last_of('/');
      const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : it->substr(0, slash);
      CAIRN_RETURN_IF_ERROR(sync_dir(parent));
    }
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) return status::from_errno(errno, "stat " + dir);
    if (!S_ISDIR(st.st_mode)) return {errc::io_error, dir + " exists and is not a directory"};
    return {};
  }


  status remove_file(const std::string& path) override {
    g_counters.removes.fetch_add(1, std::memory_order_relaxed);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return status::from_errno(errno, "unlink " + path);
    return {};
  }

  status remove_dir(const std::string& dir) override {
    g_counters.removes.fetch_add(1, std::memory_order_relaxed);
    if (::rmdir(dir.c_str()) != 0 && errno != ENOENT) return status::from_errno(errno, "rmdir " + dir);
    return {};
  }

  result<std::vector<std::string>> list(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
      if (errno == ENOENT) return status(errc::not_found, dir + " does not exist");
      return status::from_errno(errno, "opendir " + dir);
    }
    std::vector<std::string> names;
    while (struct dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      names.emplace_back(e->d_name);
    }
    ::closedir(d);
    return names;
  }

  bool exists(const std::string& path) override {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
  }
};

}  // namespace

io_counters posix_io_counters() {
  io_counters c;
  c.creates = g_counters.creates.load();
  c.opens = g_counters.opens.load();
  c.syncs = g_counters.syncs.load();
  c.renames = g_counters.renames.load();
  c.dir_syncs = g_counters.dir_syncs.load();
  c.mkdirs = g_counters.mkdirs.load();
  c.removes = g_counters.removes.load();
  c.bytes_written = g_counters.bytes_written.load();
  return c;
}

storage_env* storage_env::posix() {
  static posix_env* env = new posix_env();
  return env;
}

}  // namespace cairn::storage
