#include "daemon/link.hpp"

#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "format/shard.hpp"
#include "util/hex.hpp"
#include "util/mutex.hpp"
#include "util/process.hpp"

namespace cairn::daemon {

using nlohmann::json;

result<std::shared_ptr<link>> link::connect(const std::string& name, const std::string& hello, double timeout_s,
                                            int rank) {
  CAIRN_ASSIGN_OR_RETURN(int fd, connect_to(name, timeout_s));
  // The welcome comes within timeout_s, or the daemon is not serving us
  // (never a rank hung forever in its handshake).
  const double whole = std::max(1.0, timeout_s);
  struct timeval tv {static_cast<time_t>(whole), static_cast<suseconds_t>((whole - std::floor(whole)) * 1e6)};
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::shared_ptr<link> l(new link(fd, rank));
  CAIRN_RETURN_IF_ERROR(l->ch_.send({msg::hello, hello, {}, -1}));
  auto w = l->ch_.recv();
  struct timeval none {};
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
  if (!w) return w.error().with_context("waiting for the node daemon's welcome");
  if (w->type != msg::welcome) return status(errc::internal, "node daemon: unexpected answer to hello");
  auto meta = json::parse(w->meta, nullptr, false);
  if (meta.is_discarded()) return status(errc::corruption, "node daemon: unreadable welcome");
  if (meta.contains("error"))
    return status(static_cast<errc>(meta.value("code", static_cast<int>(errc::internal))),
                  "node daemon: " + meta["error"].get<std::string>());
  l->pid_ = meta.value("pid", 0);
  if (auto hex = meta.value("plane", std::string()); !hex.empty()) {
    if (!util::hex_decode(hex, hex.size() / 2, &l->plane_address_))
      return status(errc::corruption, "node daemon: unreadable plane address in its welcome");
  }
  l->reader_ = std::thread([p = l.get()] { p->reader_main(); });
  return l;
}

link::~link() {
  bye();
  ch_.shutdown();
  if (reader_.joinable()) reader_.join();
}

bool link::alive() {
  cairn::lock_guard lk(mu_);
  return alive_;
}

void link::lost(const std::string& why) {
  bool warn;
  {
    cairn::lock_guard lk(mu_);
    warn = alive_ && !said_bye_;
    alive_ = false;
  }
  cv_.notify_all();
  if (warn)
    std::fprintf(stderr, "cairn: warning: rank %d: the node daemon cairnd (pid %d) is gone (%s); this rank continues "
                         "with engine threads of its own, and versions the daemon had not finished are written by them\n",
                 rank_, pid_, why.c_str());
}

void link::reader_main() {
  util::name_this_thread("cairn-daemon");
  for (;;) {
    auto f = ch_.recv();
    if (!f) {
      lost(f.error().message());
      return;
    }
    if (f->type != msg::stage) continue;
    auto meta = json::parse(f->meta, nullptr, false);
    if (meta.is_discarded()) continue;
    stage_report r;
    const int code = meta.value("code", 0);
    if (code != 0) r.st = status(static_cast<errc>(code), "cairnd: " + meta.value("message", std::string()));
    r.seconds = meta.value("s", 0.0);
    r.at = meta.value("at", 0.0);
    r.checksum_s = meta.value("checksum_s", 0.0);
    r.hash_s = meta.value("hash_s", 0.0);
    r.payload = std::move(f->payload);
    {
      cairn::lock_guard lk(mu_);
      reports_[{meta.value("id", uint64_t{0}), meta.value("stage", std::string())}] = std::move(r);
    }
    cv_.notify_all();
  }
}

status link::start(const std::string& meta) {
  return ch_.send({msg::start, meta, {}, -1}).with_context("starting the node daemon's engine");
}

bool link::submit(engine::version_job& job) {
  uint64_t id;
  bool send_slot;
  {
    cairn::lock_guard lk(mu_);
    if (!alive_) return false;
    id = next_id_++;
    send_slot = slots_sent_.insert(job.image->id()).second;
  }
  if (send_slot) {
    json m = {{"id", job.image->id()}, {"size", job.image->size()}};
    if (!ch_.send({msg::slot, m.dump(), {}, job.image->fd()})) return false;
  }
  // The planned header (checksums still zero): the daemon's checksum stage completes it.
  format::shard_header h = job.header;
  std::string header(h.data_offset, '\0');
  format::encode_header(h, std::as_writable_bytes(std::span<char>(header.data(), header.size())));
  json m = {{"id", id},           {"slot", job.image->id()},       {"wanted", job.wanted},
            {"captured_at", job.captured_at}, {"capture_s", job.capture_s}};
  if (!ch_.send({msg::job, m.dump(), std::move(header), -1})) return false;
  job.daemon_id = id;
  return true;
}

void link::release_slot(uint64_t id) {
  {
    cairn::lock_guard lk(mu_);
    if (!alive_ || slots_sent_.erase(id) == 0) return;
  }
  (void)ch_.send({msg::release, json{{"id", id}}.dump(), {}, -1});
}

stage_report link::wait(const engine::version_job& job, const std::string& stage) {
  cairn::unique_lock lk(mu_);
  const auto key = std::make_pair(job.daemon_id, stage);
  cv_.wait(lk, [&]() CAIRN_REQUIRES(mu_) { return job.daemon_id == 0 || !alive_ || abandoned_ || reports_.count(key); });
  auto it = reports_.find(key);
  if (abandoned_ && it == reports_.end()) {
    stage_report r;
    r.st = status(errc::cancelled, "the application finalized without waiting for this version");
    return r;
  }
  if (job.daemon_id == 0 || it == reports_.end()) {
    stage_report gone;
    gone.gone = true;
    return gone;
  }
  stage_report r = std::move(it->second);
  reports_.erase(it);
  return r;
}

void link::committed(const std::string& name, int64_t version) {
  if (!alive()) return;
  json m = {{"name", name}, {"version", version}};
  (void)ch_.send({msg::committed, m.dump(), {}, -1});
}

void link::abandon() {
  {
    cairn::lock_guard lk(mu_);
    abandoned_ = true;
  }
  cv_.notify_all();
}

void link::bye() {
  {
    cairn::lock_guard lk(mu_);
    if (said_bye_) return;
    said_bye_ = true;
    if (!alive_) return;
  }
  (void)ch_.send({msg::bye, "{}", {}, -1});
}

namespace {

class image_proxy final : public engine::stage {
 public:
  image_proxy(std::shared_ptr<link> l, std::unique_ptr<engine::stage> checksum)
      : link_(std::move(l)), checksum_(std::move(checksum)) {}
  const char* name() const override { return "checksum"; }
  bool essential() const override { return true; }
  status run(engine::version_job& job) override {
    stage_report r = link_->wait(job, "image");
    if (r.gone) return checksum_->run(job);
    CAIRN_RETURN_IF_ERROR(r.st);
    // The daemon wrote the header with the checksums into the shared slot.
    CAIRN_ASSIGN_OR_RETURN(job.header, format::decode_header(job.image->span(), "the staging slot (from cairnd)"));
    job.tree_image = std::move(r.payload);
    job.checksum_s = r.checksum_s;
    job.hash_s = r.hash_s;
    return {};
  }

 private:
  std::shared_ptr<link> link_;
  std::unique_ptr<engine::stage> checksum_;
};

class level_proxy final : public engine::stage {
 public:
  level_proxy(std::shared_ptr<link> l, std::unique_ptr<engine::stage> inner)
      : link_(std::move(l)), inner_(std::move(inner)) {}
  const char* name() const override { return inner_->name(); }
  unsigned level() const override { return inner_->level(); }
  bool latches() const override { return inner_->latches(); }
  bool applies(const engine::version_job& job) const override { return inner_->applies(job); }
  status run(engine::version_job& job) override {
    stage_report r = link_->wait(job, inner_->name());
    if (r.gone) return inner_->run(job);
    CAIRN_RETURN_IF_ERROR(r.st);
    if (level() == engine::kLevelLocal) {
      job.local_s = r.seconds;
    } else if (level() == engine::kLevelPersistent) {
      job.persistent_s = r.seconds;
      job.persistent_at = r.at;
    }
    return {};
  }

 private:
  std::shared_ptr<link> link_;
  std::unique_ptr<engine::stage> inner_;
};

class unreachable_stage final : public engine::stage {
 public:
  unreachable_stage(const char* name, unsigned level, std::string why) : name_(name), level_(level), why_(std::move(why)) {}
  const char* name() const override { return name_; }
  unsigned level() const override { return level_; }
  bool latches() const override { return false; }
  status run(engine::version_job&) override { return {errc::cancelled, why_}; }

 private:
  const char* name_;
  unsigned level_;
  std::string why_;
};

}  // namespace

std::unique_ptr<engine::stage> make_unreachable_stage(const char* name, unsigned level, std::string why) {
  return std::make_unique<unreachable_stage>(name, level, std::move(why));
}

std::unique_ptr<engine::stage> make_image_proxy(std::shared_ptr<link> l, std::unique_ptr<engine::stage> checksum) {
  return std::make_unique<image_proxy>(std::move(l), std::move(checksum));
}

std::unique_ptr<engine::stage> make_level_proxy(std::shared_ptr<link> l, std::unique_ptr<engine::stage> inner) {
  return std::make_unique<level_proxy>(std::move(l), std::move(inner));
}

}  // namespace cairn::daemon
