// Every file operation of cairn goes through storage_env, so tests can run with
// injected faults (fault_env) and later levels can use other back ends.
// Thread-safety: an env may be used from several threads at once; a file object
// from one thread at a time except write_at/read_at, which may run in parallel
// on disjoint ranges.
#ifndef CAIRN_STORAGE_ENV_HPP
#define CAIRN_STORAGE_ENV_HPP

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/status.hpp"

namespace cairn::storage {

// Alignment of buffers, offsets and lengths for direct I/O.
inline constexpr size_t kDirectAlign = 4096;

class writable_file {
 public:
  virtual ~writable_file() = default;
  // Writes all of [data, data+len) at offset. With direct I/O, data, len and
  // offset must be multiples of kDirectAlign.
  virtual status write_at(uint64_t offset, const void* data, size_t len) = 0;
  virtual status sync() = 0;   // fdatasync
  virtual status close() = 0;  // idempotent; the destructor closes too
  virtual bool direct() const = 0;
};

class readable_file {
 public:
  virtual ~readable_file() = default;
  // Reads exactly len bytes at offset; a short file is a corruption error.
  virtual status read_at(uint64_t offset, void* data, size_t len) const = 0;
  virtual uint64_t size() const = 0;
  // The whole file mapped read-only (its pages faulted in), or an empty span
  // where this file cannot be mapped: then read it with read_at. The mapping
  // lives as long as this object and is read without a copy; the file must
  // not be changed in place meanwhile (cairn replaces files by rename, which
  // leaves a mapping intact). Not thread-safe.
  virtual std::span<const std::byte> map() { return {}; }
  // The bytes a reader going through the file piece by piece should ask for
  // at a time (each read_at is a round trip); 0: the reader's own choice.
  virtual uint64_t read_piece() const { return 0; }
};

// A whole file mapped for reading and writing, shared: stores reach the file
// as write(2) would, without the kernel's copy. Its pages are faulted in when
// it is made; the mapping lives as long as this object. The file must not be
// truncated meanwhile (cairn never truncates a file it renamed into place).
class mapped_file {
 public:
  virtual ~mapped_file() = default;
  virtual std::span<std::byte> bytes() = 0;
  // Whether `path` names the mapped file now (the same device and inode).
  virtual bool is(const std::string& path) const = 0;
};

class storage_env {
 public:
  virtual ~storage_env() = default;
  // Creates a file for writing, truncating it unless `truncate` is false (a
  // file several processes write parts of keeps what the others wrote).
  // want_direct asks for O_DIRECT; the file falls back to buffered I/O where
  // the file system refuses it.
  virtual result<std::unique_ptr<writable_file>> create(const std::string& path, bool want_direct,
                                                        bool truncate = true) = 0;
  virtual result<std::unique_ptr<readable_file>> open_read(const std::string& path) = 0;
  virtual status rename(const std::string& from, const std::string& to) = 0;
  virtual status sync_dir(const std::string& dir) = 0;
  virtual status make_dirs(const std::string& dir) = 0;  // mkdir -p
  virtual status remove_file(const std::string& path) = 0;  // ok if absent
  virtual status remove_dir(const std::string& dir) = 0;    // empty dir; ok if absent
  // Names in dir (no "." or ".."); not_found if dir does not exist.
  virtual result<std::vector<std::string>> list(const std::string& dir) = 0;
  virtual bool exists(const std::string& path) = 0;
  // The existing file at `path` mapped (mapped_file). not_supported where
  // this env's writes must go through writable_file (the wrappers below: a
  // fault, a rate or a power loss applies to write_at), and on an empty file.
  virtual result<std::unique_ptr<mapped_file>> map_shared(const std::string& path);

  // Reads a whole (small) file.
  result<std::string> read_all(const std::string& path);
  // Writes to path.tmp, syncs it if `durable`, renames to path, syncs the
  // directory if `durable`. On failure removes the temporary and leaves any
  // previous file at `path` untouched.
  // unique_tmp: the temporary name is unique to this call (pid and a
  // counter), for files several processes may write at once (a version's
  // MANIFEST written by whichever writer completes it); otherwise path.tmp.
  status write_atomic(const std::string& path, std::string_view data, bool durable, bool unique_tmp = false);
  // Removes a directory tree (files and subdirectories).
  status remove_tree(const std::string& dir);

  // The process-wide POSIX env (never deleted).
  static storage_env* posix();
};

// An env that passes every call to `base` (not owned), and a file that
// passes every call to the file it wraps: the wrappers below (fault
// injection, rate limit) and the power-loss env override what they change.
class forwarding_env : public storage_env {
 public:
  explicit forwarding_env(storage_env* base) : base_(base) {}
  result<std::unique_ptr<writable_file>> create(const std::string& path, bool want_direct, bool truncate) override {
    return base_->create(path, want_direct, truncate);
  }
  result<std::unique_ptr<readable_file>> open_read(const std::string& path) override { return base_->open_read(path); }
  status rename(const std::string& from, const std::string& to) override { return base_->rename(from, to); }
  status sync_dir(const std::string& dir) override { return base_->sync_dir(dir); }
  status make_dirs(const std::string& dir) override { return base_->make_dirs(dir); }
  status remove_file(const std::string& path) override { return base_->remove_file(path); }
  status remove_dir(const std::string& dir) override { return base_->remove_dir(dir); }
  result<std::vector<std::string>> list(const std::string& dir) override { return base_->list(dir); }
  bool exists(const std::string& path) override { return base_->exists(path); }

 protected:
  storage_env* base_;
};

class forwarding_file : public writable_file {
 public:
  explicit forwarding_file(std::unique_ptr<writable_file> f) : f_(std::move(f)) {}
  status write_at(uint64_t off, const void* d, size_t n) override { return f_->write_at(off, d, n); }
  status sync() override { return f_->sync(); }
  status close() override { return f_->close(); }
  bool direct() const override { return f_->direct(); }

 protected:
  std::unique_ptr<writable_file> f_;
};

// What this process asked of the file system through the POSIX env since it
// started (cairn_io_counters, benchmarks): metadata operations and bytes.
struct io_counters {
  uint64_t creates = 0;    // files opened for writing (created or truncated)
  uint64_t opens = 0;      // files opened for reading
  uint64_t syncs = 0;      // fdatasync of files
  uint64_t renames = 0;
  uint64_t dir_syncs = 0;  // fsync of directories
  uint64_t mkdirs = 0;     // mkdir calls (make_dirs: one per path component)
  uint64_t removes = 0;    // unlink and rmdir
  uint64_t bytes_written = 0;
};
io_counters posix_io_counters();

// Fault injection for tests (config key fault_inject, not a user feature).
// An env that forwards to `base` but, for paths under `prefix` (and containing
// `path_part` when set), after `after` matching calls:
//   action "error": fails the operation with errno `err`;
//   action "kill":  writes the first half of the data, then SIGKILLs the process
//                   (a crash in the middle of a write).
// kind selects the operation: "write", "sync", "create", "rename" or "any".
struct fault_spec {
  std::string prefix;
  std::string path_part;
  std::string kind = "any";
  std::string action = "error";
  int err = 5;  // EIO
  int after = 0;
};
std::unique_ptr<storage_env> make_fault_env(storage_env* base, fault_spec spec);

// The configuration key fault_inject, parsed and checked:
// "level=L,action=A[,kind=K][,errno=E][,after=N][,rank=R][,version=V[,file=F]][,role=R]".
// Levels local and persistent make a fault env (spec; its prefix is the
// caller's: the node-local or the persistent directory); capture, redundancy
// and transfer are kill points in the client's own code, at `version`.
struct fault_plan {
  std::string level = "persistent";  // local, persistent, capture, redundancy, transfer
  int rank = -1;                     // only this rank (-1: every rank)
  int64_t version = -1;              // the version the fault hits (-1: any)
  std::string role;                  // transfer: leader or sender; redundancy: rebuild (else encoding)
  fault_spec spec;                   // action, kind, errno, after; path_part from version and file
};
result<fault_plan> parse_fault_plan(const std::string& text);
// The env that process `rank` writes through under `plan`: a fault env over
// `base` for levels local and persistent (prefix local_dir or
// persistent_dir) when the plan hits this rank; null otherwise (the kill
// points are their owners': capture the client's, redundancy and transfer
// their levels').
std::unique_ptr<storage_env> make_planned_fault_env(storage_env* base, fault_plan plan, int rank,
                                                    const std::string& local_dir, const std::string& persistent_dir);

// A power loss, for tests (leveldb's FaultInjectionTestEnv): an env that
// forwards to `base` and journals what a POSIX file system may still lose:
// file data written since the file's last sync (crash() overwrites it with
// garbage and cuts the file back to its size at that sync), and directory
// entries created, renamed or removed since their directory's last sync
// (crash() undoes them, newest first: a created file or directory vanishes,
// a rename goes back, a removed file returns). Removed files and files renamed
// over are kept as hard links in `backup_dir` (same file system).
// freeze_after(n): the machine dies after n more mutating operations (create,
// write, sync, rename, sync_dir, mkdir, remove): every later one fails with
// io_error and does nothing, so the code under test stops where it was.
class crash_env : public storage_env {
 public:
  virtual void freeze_after(int64_t ops) = 0;
  virtual bool frozen() const = 0;
  virtual int64_t operations() const = 0;  // mutating operations done so far
  // Drops what the power loss may drop (above) and thaws the env. seed 0:
  // every unsynced entry change is undone and unsynced file data read back
  // as garbage; otherwise each entry change is undone independently with
  // probability 1/2 (the kernel may have written some back, in any order),
  // and each file keeps its unsynced writes up to a random point, the later
  // ones undone: the bytes they overwrote come back (a file overwritten in
  // place and renamed may keep its former contents under its new name).
  // Drawn from `seed`.
  virtual status crash(uint64_t seed = 0) = 0;
};
std::unique_ptr<crash_env> make_crash_env(storage_env* base, std::string backup_dir);

// Background write bandwidth cap (config key io_rate_limit): an env that
// forwards to `base` but writes through its files in chunks of at most 8 MiB,
// each started no earlier than the cap allows (one token bucket per env,
// shared by every thread and file that writes through it). Reads and metadata
// pass through unthrottled.
std::unique_ptr<storage_env> make_rate_limited_env(storage_env* base, uint64_t bytes_per_s);

std::string dirname_of(const std::string& path);
std::string join(const std::string& a, const std::string& b);

}  // namespace cairn::storage

#endif
