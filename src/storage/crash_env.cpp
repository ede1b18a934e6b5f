// crash_env: a power loss for tests (storage_env.hpp). Everything passes to
// the base env; what a power loss may drop is journaled beside it and undone
// by crash().
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <map>
#include <random>
#include <vector>

#include "storage/storage_env.hpp"
#include "util/mutex.hpp"

namespace cairn::storage {
namespace {

// A directory entry changed since its directory was last synced.
struct entry_op {
  enum kind_t { created_file, created_dir, renamed, removed_file, removed_dir } kind;
  std::string dir;     // the directory whose fsync makes the change durable
  std::string path;    // the entry (for renamed: the target)
  std::string from;    // renamed: the source
  std::string backup;  // renamed over an existing file, removed_file: a hard link to what was there
};

// One write since the file's data were last synced, with what it replaced.
struct undo_write {
  uint64_t offset = 0;
  uint64_t size_before = 0;  // the file's size before the write
  std::string old;           // the bytes it overwrote (those below size_before)
};

// Writes to a file since its data was last synced.
struct file_state {
  uint64_t durable_size = 0;                            // its size at the last sync
  std::vector<std::pair<uint64_t, uint64_t>> unsynced;  // [offset, offset + length) written since
  std::vector<undo_write> undo;                         // the same writes, oldest first
};

class crash_env_impl final : public crash_env {
 public:
  crash_env_impl(storage_env* base, std::string backup_dir) : base_(base), backup_dir_(std::move(backup_dir)) {}

  void freeze_after(int64_t ops) override {
    cairn::lock_guard lk(mu_);
    freeze_at_ = ops_ + ops;
  }
  int64_t operations() const override {
    cairn::lock_guard lk(mu_);
    return ops_;
  }
  bool frozen() const override {
    cairn::lock_guard lk(mu_);
    return freeze_at_ >= 0 && ops_ >= freeze_at_;
  }

  class file final : public writable_file {
   public:
    file(crash_env_impl* env, std::string path, std::unique_ptr<writable_file> f)
        : env_(env), path_(std::move(path)), f_(std::move(f)) {}
    status write_at(uint64_t off, const void* d, size_t n) override {
      cairn::lock_guard lk(env_->mu_);
      CAIRN_RETURN_IF_ERROR(env_->step("write", path_));
      undo_write u;
      u.offset = off;
      if (int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
        struct stat s {};
        ::fstat(fd, &s);
        u.size_before = static_cast<uint64_t>(s.st_size);
        if (off < u.size_before) {
          u.old.resize(std::min<uint64_t>(n, u.size_before - off));
          const ssize_t got = ::pread(fd, u.old.data(), u.old.size(), static_cast<off_t>(off));
          u.old.resize(got > 0 ? static_cast<size_t>(got) : 0);
        }
        ::close(fd);
      }
      CAIRN_RETURN_IF_ERROR(f_->write_at(off, d, n));
      auto& st = env_->files_[path_];
      st.unsynced.emplace_back(off, off + n);
      st.undo.push_back(std::move(u));
      return {};
    }
    status sync() override {
      cairn::lock_guard lk(env_->mu_);
      CAIRN_RETURN_IF_ERROR(env_->step("sync", path_));
      CAIRN_RETURN_IF_ERROR(f_->sync());
      auto& st = env_->files_[path_];
      st.unsynced.clear();
      st.undo.clear();
      struct stat s {};
      if (::stat(path_.c_str(), &s) == 0) st.durable_size = static_cast<uint64_t>(s.st_size);
      return {};
    }
    status close() override { return f_->close(); }  // closing makes nothing durable
    bool direct() const override { return f_->direct(); }

   private:
    crash_env_impl* env_;
    std::string path_;
    std::unique_ptr<writable_file> f_;
  };

  result<std::unique_ptr<writable_file>> create(const std::string& path, bool want_direct, bool truncate) override {
    cairn::lock_guard lk(mu_);
    CAIRN_RETURN_IF_ERROR(step("create", path));
    const bool existed = base_->exists(path);
    CAIRN_ASSIGN_OR_RETURN(auto f, base_->create(path, want_direct, truncate));
    if (!existed) {
      journal_.push_back({entry_op::created_file, dirname_of(path), path, {}, {}});
      files_[path] = {};
    } else if (truncate) {
      // The old contents may survive the truncation: model the worst case,
      // nothing of it (a file truncated and not synced reads as lost data).
      files_[path].unsynced.emplace_back(0, files_[path].durable_size);
    }
    return std::unique_ptr<writable_file>(new file(this, path, std::move(f)));
  }

  result<std::unique_ptr<readable_file>> open_read(const std::string& path) override { return base_->open_read(path); }

  status rename(const std::string& from, const std::string& to) override {
    cairn::lock_guard lk(mu_);
    CAIRN_RETURN_IF_ERROR(step("rename", to));
    std::string backup;
    if (base_->exists(to)) {
      backup = next_backup();
      if (::link(to.c_str(), backup.c_str()) != 0) return status::from_errno(errno, "crash_env: link " + to);
    }
    CAIRN_RETURN_IF_ERROR(base_->rename(from, to));
    journal_.push_back({entry_op::renamed, dirname_of(to), to, from, backup});
    if (auto it = files_.find(from); it != files_.end()) {
      files_[to] = std::move(it->second);
      files_.erase(from);
    }
    return {};
  }

  status sync_dir(const std::string& dir) override {
    cairn::lock_guard lk(mu_);
    CAIRN_RETURN_IF_ERROR(step("sync_dir", dir));
    CAIRN_RETURN_IF_ERROR(base_->sync_dir(dir));
    std::erase_if(journal_, [&](const entry_op& op) { return op.dir == dir; });
    return {};
  }

  // As the POSIX env: each missing component created, then its entry made
  // durable in its parent (through sync_dir, so the journal sees it).
  status make_dirs(const std::string& dir) override {
    std::vector<std::string> missing;
    {
      cairn::lock_guard lk(mu_);
      for (std::string cur = dir; !cur.empty() && cur != "/" && !base_->exists(cur); cur = dirname_of(cur))
        missing.push_back(cur);
      for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
        CAIRN_RETURN_IF_ERROR(step("mkdir", *it));
        if (base_->exists(*it)) continue;  // another thread made it
        CAIRN_RETURN_IF_ERROR(base_->make_dirs(*it));
        journal_.push_back({entry_op::created_dir, dirname_of(*it), *it, {}, {}});
      }
    }
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) CAIRN_RETURN_IF_ERROR(sync_dir(dirname_of(*it)));
    return {};
  }

  status remove_file(const std::string& path) override {
    cairn::lock_guard lk(mu_);
    CAIRN_RETURN_IF_ERROR(step("remove", path));
    if (!base_->exists(path)) return {};
    const std::string backup = next_backup();
    if (::link(path.c_str(), backup.c_str()) != 0) return status::from_errno(errno, "crash_env: link " + path);
    CAIRN_RETURN_IF_ERROR(base_->remove_file(path));
    journal_.push_back({entry_op::removed_file, dirname_of(path), path, {}, backup});
    return {};
  }

  status remove_dir(const std::string& dir) override {
    cairn::lock_guard lk(mu_);
    CAIRN_RETURN_IF_ERROR(step("remove", dir));
    if (!base_->exists(dir)) return {};
    CAIRN_RETURN_IF_ERROR(base_->remove_dir(dir));
    if (!base_->exists(dir)) journal_.push_back({entry_op::removed_dir, dirname_of(dir), dir, {}, {}});
    return {};
  }

  result<std::vector<std::string>> list(const std::string& dir) override { return base_->list(dir); }
  bool exists(const std::string& path) override { return base_->exists(path); }

  status crash(uint64_t seed) override {
    cairn::lock_guard lk(mu_);
    std::mt19937_64 rng(seed);
    // File data first, at the paths the files have now.
    for (auto& [path, st] : files_) {
      if (st.unsynced.empty() || !base_->exists(path)) continue;
      int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd < 0) return status::from_errno(errno, "crash_env: open " + path);
      if (seed != 0) {
        // The writes the kernel had written back before the power went: the
        // oldest ones, up to a random point; the later ones never reached
        // the disk, which still holds what they overwrote (a recycled file
        // keeps its former contents under its new name).
        const size_t kept = static_cast<size_t>(rng() % (st.undo.size() + 1));
        for (size_t i = st.undo.size(); i-- > kept;) {
          const undo_write& u = st.undo[i];
          if (!u.old.empty() && ::pwrite(fd, u.old.data(), u.old.size(), static_cast<off_t>(u.offset)) < 0) {
            ::close(fd);
            return status::from_errno(errno, "crash_env: pwrite " + path);
          }
          if (::ftruncate(fd, static_cast<off_t>(u.size_before)) != 0) {
            ::close(fd);
            return status::from_errno(errno, "crash_env: ftruncate " + path);
          }
        }
        ::close(fd);
        continue;
      }
      struct stat s {};
      ::fstat(fd, &s);
      uint64_t size = static_cast<uint64_t>(s.st_size);
      bool grown = false;
      for (auto [a, b] : st.unsynced) {
        if (b > st.durable_size) grown = true;
        // Unsynced bytes below the durable size read back as garbage.
        const uint64_t end = std::min({b, st.durable_size, size});
        if (a < end) {
          std::vector<char> junk(end - a, static_cast<char>(0xEE));
          if (::pwrite(fd, junk.data(), junk.size(), static_cast<off_t>(a)) < 0) {
            ::close(fd);
            return status::from_errno(errno, "crash_env: pwrite " + path);
          }
        }
      }
      // The file's growth since its last sync is lost (its size falls back).
      if (grown && ::ftruncate(fd, static_cast<off_t>(st.durable_size)) != 0) {
        ::close(fd);
        return status::from_errno(errno, "crash_env: ftruncate " + path);
      }
      ::close(fd);
    }
    // Then every entry change not made durable, newest first.
    for (auto it = journal_.rbegin(); it != journal_.rend(); ++it) {
      // Some of them may have reached the disk anyway (written back before
      // the power went), in any order.
      if (seed != 0 && (rng() & 1)) continue;
      // An entry of a directory whose own removal is durable went with it.
      if (!base_->exists(it->dir)) continue;
      switch (it->kind) {
        case entry_op::created_file:
          CAIRN_RETURN_IF_ERROR(base_->remove_file(it->path));
          break;
        case entry_op::created_dir:
          CAIRN_RETURN_IF_ERROR(base_->remove_tree(it->path));
          CAIRN_RETURN_IF_ERROR(base_->remove_dir(it->path));
          break;
        case entry_op::renamed:
          // A rename from a directory whose removal stayed cannot go back.
          if (!base_->exists(dirname_of(it->from))) continue;
          if (base_->exists(it->path)) CAIRN_RETURN_IF_ERROR(base_->rename(it->path, it->from));
          if (!it->backup.empty() && ::link(it->backup.c_str(), it->path.c_str()) != 0)
            return status::from_errno(errno, "crash_env: link back " + it->path);
          break;
        case entry_op::removed_file:
          if (!base_->exists(it->path) && ::link(it->backup.c_str(), it->path.c_str()) != 0)
            return status::from_errno(errno, "crash_env: link back " + it->path);
          break;
        case entry_op::removed_dir:
          CAIRN_RETURN_IF_ERROR(base_->make_dirs(it->path));
          break;
      }
    }
    journal_.clear();
    files_.clear();
    freeze_at_ = -1;
    return {};
  }

 private:
  // Counts a mutating operation; once frozen, fails it.
  status step(const char* op, const std::string& path) CAIRN_REQUIRES(mu_) {
    if (freeze_at_ >= 0 && ops_ >= freeze_at_)
      return {errc::io_error, std::string("crash_env: the machine is down (") + op + " " + path + ")"};
    ++ops_;
    return {};
  }
  std::string next_backup() CAIRN_REQUIRES(mu_) { return join(backup_dir_, "b" + std::to_string(++backups_)); }

  storage_env* base_;
  std::string backup_dir_;
  mutable cairn::mutex mu_;
  int64_t ops_ CAIRN_GUARDED_BY(mu_) = 0;
  int64_t freeze_at_ CAIRN_GUARDED_BY(mu_) = -1;
  uint64_t backups_ CAIRN_GUARDED_BY(mu_) = 0;
  std::vector<entry_op> journal_ CAIRN_GUARDED_BY(mu_);
  std::map<std::string, file_state> files_ CAIRN_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<crash_env> make_crash_env(storage_env* base, std::string backup_dir) {
  return std::make_unique<crash_env_impl>(base, std::move(backup_dir));
}

}  // namespace cairn::storage
