#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <atomic>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <thread>

#include "storage/storage_env.hpp"
#include "util/mutex.hpp"

namespace cairn::storage {

std::string dirname_of(const std::string& path) {
  auto pos = path.find_last_of('/');
  if (pos == std::string::npos) return ".";
  if (pos == 0) return "/";
  return path.substr(0, pos);
}

std::string join(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

result<std::unique_ptr<mapped_file>> storage_env::map_shared(const std::string& path) {
  return status(errc::not_supported, path + ": this storage env writes through files only");
}

result<std::string> storage_env::read_all(const std::string& path) {
  CAIRN_ASSIGN_OR_RETURN(auto f, open_read(path));
  std::string data(f->size(), '\0');
  CAIRN_RETURN_IF_ERROR(f->read_at(0, data.data(), data.size()));
  return data;
}

status storage_env::write_atomic(const std::string& path, std::string_view data, bool durable, bool unique_tmp) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = unique_tmp ? path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(++counter)
                                     : path + ".tmp";
  auto fail = [&](status st) {
    (void)remove_file(tmp);
    return st;
  };
  auto f = create(tmp, false);
  if (!f) return f.take_status();
  if (status st = (*f)->write_at(0, data.data(), data.size()); !st) return fail(st);
  if (durable) {
    if (status st = (*f)->sync(); !st) return fail(st);
  }
  if (status st = (*f)->close(); !st) return fail(st);
  if (status st = rename(tmp, path); !st) return fail(st);
  if (durable) return sync_dir(dirname_of(path));
  return {};
}

status storage_env::remove_tree(const std::string& dir) {
  auto names = list(dir);
  if (!names) return names.error().code() == errc::not_found ? status() : names.take_status();
  for (auto& n : *names) {
    std::string p = join(dir, n);
    struct stat st {};
    if (::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      CAIRN_RETURN_IF_ERROR(remove_tree(p));
    } else {
      CAIRN_RETURN_IF_ERROR(remove_file(p));
    }
  }
  return remove_dir(dir);
}

namespace {

// Injects errors for tests: see make_fault_env.
class fault_env final : public forwarding_env {
 public:
  fault_env(storage_env* base, fault_spec spec) : forwarding_env(base), spec_(std::move(spec)) {}

  bool should_fail(const std::string& path, const char* kind) {
    if (path.rfind(spec_.prefix, 0) != 0) return false;
    if (!spec_.path_part.empty() && path.find(spec_.path_part) == std::string::npos) return false;
    if (spec_.kind != "any" && spec_.kind != kind) return false;
    return seen_.fetch_add(1) >= spec_.after;
  }
  status injected(const std::string& path, const char* op) {
    return status::from_errno(spec_.err, std::string("(injected fault) ") + op + " " + path);
  }

  class file final : public forwarding_file {
   public:
    file(fault_env* env, std::string path, std::unique_ptr<writable_file> f)
        : forwarding_file(std::move(f)), env_(env), path_(std::move(path)) {}
    status write_at(uint64_t off, const void* d, size_t n) override {
      if (env_->should_fail(path_, "write")) {
        if (env_->spec_.action == "kill") {
          size_t half = n / 2 / kDirectAlign * kDirectAlign;
          if (half) (void)f_->write_at(off, d, half);
          ::raise(SIGKILL);
        }
        return env_->injected(path_, "write");
      }
      return f_->write_at(off, d, n);
    }
    status sync() override {
      if (env_->should_fail(path_, "sync")) return env_->injected(path_, "sync");
      return f_->sync();
    }

   private:
    fault_env* env_;
    std::string path_;
  };

  result<std::unique_ptr<writable_file>> create(const std::string& path, bool want_direct, bool truncate) override {
    if (should_fail(path, "create")) return injected(path, "create");
    CAIRN_ASSIGN_OR_RETURN(auto f, base_->create(path, want_direct, truncate));
    return std::unique_ptr<writable_file>(new file(this, path, std::move(f)));
  }
  status rename(const std::string& from, const std::string& to) override {
    if (should_fail(to, "rename")) return injected(to, "rename");
    return base_->rename(from, to);
  }

 private:
  fault_spec spec_;
  std::atomic<int> seen_{0};
};

// See make_rate_limited_env.
class rate_limited_env final : public forwarding_env {
 public:
  rate_limited_env(storage_env* base, uint64_t bytes_per_s)
      : forwarding_env(base), rate_(static_cast<double>(bytes_per_s)) {}

  // Blocks until `n` more bytes may be written: the bucket's clock advances
  // by n / rate per chunk; a writer idle for a while gets no burst beyond one
  // chunk.
  void pace(size_t n) {
    using clock = std::chrono::steady_clock;
    clock::time_point start;
    {
      cairn::lock_guard lk(mu_);
      const auto now = clock::now();
      if (next_ < now) next_ = now;
      start = next_;
      next_ += std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(n / rate_));
    }
    std::this_thread::sleep_until(start);
  }

  class file final : public forwarding_file {
   public:
    file(rate_limited_env* env, std::unique_ptr<writable_file> f) : forwarding_file(std::move(f)), env_(env) {}
    status write_at(uint64_t off, const void* d, size_t n) override {
      constexpr size_t kChunk = size_t{8} << 20;  // a multiple of kDirectAlign
      const auto* p = static_cast<const std::byte*>(d);
      for (size_t done = 0; done < n;) {
        const size_t len = std::min(kChunk, n - done);
        env_->pace(len);
        CAIRN_RETURN_IF_ERROR(f_->write_at(off + done, p + done, len));
        done += len;
      }
      return {};
    }

   private:
    rate_limited_env* env_;
  };

  result<std::unique_ptr<writable_file>> create(const std::string& path, bool want_direct, bool truncate) override {
    CAIRN_ASSIGN_OR_RETURN(auto f, base_->create(path, want_direct, truncate));
    return std::unique_ptr<writable_file>(new file(this, std::move(f)));
  }

 private:
  const double rate_;
  cairn::mutex mu_;
  std::chrono::steady_clock::time_point next_ CAIRN_GUARDED_BY(mu_){};  // when the next chunk may start
};

}  // namespace

std::unique_ptr<storage_env> make_rate_limited_env(storage_env* base, uint64_t bytes_per_s) {
  return std::make_unique<rate_limited_env>(base, bytes_per_s);
}

std::unique_ptr<storage_env> make_fault_env(storage_env* base, fault_spec spec) {
  return std::make_unique<fault_env>(base, std::move(spec));
}

result<fault_plan> parse_fault_plan(const std::string& text) {
  fault_plan p;
  std::string file;
  auto bad = [](const std::string& why) {
    return status(errc::invalid_argument, "configuration key 'fault_inject': " + why);
  };
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string kv = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? text.size() + 1 : comma + 1;
    auto eq = kv.find('=');
    if (eq == std::string::npos) return bad("expected key=value, got '" + kv + "'");
    std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    try {
      if (k == "level") p.level = v;
      else if (k == "action") p.spec.action = v;
      else if (k == "kind") p.spec.kind = v;
      else if (k == "errno") p.spec.err = std::stoi(v);
      else if (k == "after") p.spec.after = std::stoi(v);
      else if (k == "rank") p.rank = std::stoi(v);
      else if (k == "role") p.role = v;
      else if (k == "file") file = v;
      else if (k == "version") p.version = std::stoll(v);
      else return bad("unknown field '" + k + "'");
    } catch (const std::exception&) {
      return bad("bad number in '" + kv + "'");
    }
  }
  if (p.version >= 0) {
    // A version's directory, v<version:012> (format::version_dir_name; the
    // format module sits above this one).
    char dir[32];
    std::snprintf(dir, sizeof dir, "/v%012lld/", static_cast<long long>(p.version));
    p.spec.path_part = dir;
  }
  if (!file.empty()) {
    if (p.version < 0) return bad("file needs version");
    p.spec.path_part += file;
  }
  const std::string& l = p.level;
  if (l != "local" && l != "persistent" && l != "capture" && l != "transfer" && l != "redundancy")
    return bad("level must be local, persistent, capture, transfer or redundancy");
  if (p.spec.action != "error" && p.spec.action != "kill") return bad("action must be error or kill");
  const bool kill_point = l == "capture" || l == "redundancy" || l == "transfer";
  if (kill_point && (p.spec.action != "kill" || p.version < 0))
    return bad("level=" + l + " needs action=kill and a version");
  if (l == "transfer" && p.role != "leader" && p.role != "sender")
    return bad("level=transfer needs action=kill, a version and role=leader or role=sender");
  if (l == "redundancy" && !p.role.empty() && p.role != "rebuild")
    return bad("level=redundancy takes role=rebuild (a kill in the rebuild at restart) or no role (in the encoding)");
  return p;
}

std::unique_ptr<storage_env> make_planned_fault_env(storage_env* base, fault_plan plan, int rank,
                                                    const std::string& local_dir, const std::string& persistent_dir) {
  if (plan.rank >= 0 && plan.rank != rank) return nullptr;
  if (plan.level != "local" && plan.level != "persistent") return nullptr;
  plan.spec.prefix = plan.level == "local" ? local_dir : persistent_dir;
  return make_fault_env(base, std::move(plan.spec));
}

}  // namespace cairn::storage
