#include "daemon/protocol.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include <cstdio>
#include <functional>

#include "format/shard.hpp"
#include "util/clock.hpp"
#include "util/hash.hpp"
#include "util/hex.hpp"
#include "util/json.hpp"
#include "util/mutex.hpp"

namespace cairn::daemon {
namespace {

sockaddr_un address(const std::string& name, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  // Abstract namespace: a leading NUL, then the name (not NUL-terminated).
  size_t n = std::min(name.size(), sizeof a.sun_path - 1);
  std::memcpy(a.sun_path + 1, name.data(), n);
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return a;
}

void put_u32(std::string* s, uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);
  s->append(b, 4);
}

}  // namespace

channel::~channel() {
  for (int fd : fds_) close(fd);
  if (fd_ >= 0) close(fd_);
}

void channel::shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

status channel::send(const frame& f) {
  std::string buf;
  buf.reserve(9 + f.meta.size() + f.payload.size());
  put_u32(&buf, static_cast<uint32_t>(1 + 4 + f.meta.size() + f.payload.size()));
  buf.push_back(static_cast<char>(f.type));
  put_u32(&buf, static_cast<uint32_t>(f.meta.size()));
  buf += f.meta;
  buf += f.payload;
  cairn::lock_guard lk(send_mu_);
  size_t off = 0;
  while (off < buf.size()) {
    iovec iov{buf.data() + off, buf.size() - off};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))];
    if (off == 0 && f.fd >= 0) {
      m.msg_control = ctl;
      m.msg_controllen = sizeof ctl;
      cmsghdr* c = CMSG_FIRSTHDR(&m);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &f.fd, sizeof(int));
    }
    ssize_t n = sendmsg(fd_, &m, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return status::from_errno(errno, "node daemon connection");
    }
    off += static_cast<size_t>(n);
  }
  return {};
}

status channel::read_exact(char* p, size_t n) {
  while (n > 0) {
    iovec iov{p, n};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * 4)];
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    ssize_t r = recvmsg(fd_, &m, MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)  // a receive timeout (SO_RCVTIMEO)
        return {errc::again, "node daemon connection: nothing received in time"};
      return status::from_errno(errno, "node daemon connection");
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        // Only slot frames carry one: a peer that sends more is not let
        // pile them up in this process.
        if (fds_.size() < 4) fds_.push_back(fd);
        else close(fd);
      }
    }
    if (r == 0) return {errc::not_found, "node daemon connection closed by the peer"};
    p += r;
    n -= static_cast<size_t>(r);
  }
  return {};
}

result<frame> channel::recv() {
  char head[9];
  CAIRN_RETURN_IF_ERROR(read_exact(head, 4));
  uint32_t len, meta_len;
  std::memcpy(&len, head, 4);
  if (len < 5 || len > max_frame_)
    return status(errc::corruption, "node daemon connection: a frame of " + std::to_string(len) +
                                        " bytes (at most " + std::to_string(max_frame_) + ")");
  CAIRN_RETURN_IF_ERROR(read_exact(head + 4, 5));
  std::memcpy(&meta_len, head + 5, 4);
  if (meta_len > len - 5 || meta_len > kMaxMeta)
    return status(errc::corruption, "node daemon connection: bad meta length");
  frame f;
  f.type = static_cast<msg>(head[4]);
  f.meta.resize(meta_len);
  f.payload.resize(len - 5 - meta_len);
  CAIRN_RETURN_IF_ERROR(read_exact(f.meta.data(), f.meta.size()));
  CAIRN_RETURN_IF_ERROR(read_exact(f.payload.data(), f.payload.size()));
  if (f.type == msg::slot && !fds_.empty()) {  // (without one, the receiver refuses the frame)
    f.fd = fds_.front();
    fds_.pop_front();
  }
  return f;
}

namespace {

// Parses meta and runs `read` on it (the JSON lives only during the call):
// read records field errors in f, or returns a status of its own.
template <class T>
result<T> decode(std::string_view meta, const char* what,
                 const std::function<status(util::fields&, T*)>& read) {
  const std::string where = std::string("the ") + what + " frame";
  CAIRN_ASSIGN_OR_RETURN(auto j, util::parse_json_object(meta, where));
  T out;
  util::fields f(j, where);
  status st = read(f, &out);
  if (!f.ok()) return f.error();
  if (!st) return st;
  return out;
}

// The redundancy set of a start frame.
status read_set(const nlohmann::json& r, start_msg::set* set) {
  util::fields f(r, "the start frame's redundancy");
  std::vector<std::string> peers;
  std::string key;
  f.str("scheme", &set->scheme, true, 64);
  f.u32("k", &set->k, true, 1024);
  f.u32("m", &set->m, true, 1024);
  f.u32("position", &set->position, true, 2048);
  f.u32s("members", &set->members, true, 2048);
  f.strings("nodes", &set->nodes, true, 2048, 4096);
  f.strings("peers", &peers, true, 1u << 20, 1024);
  f.str("key", &key, true, 64);
  const nlohmann::json* rec = f.object("record", false);
  if (!f.ok()) return f.error();
  for (const auto& hex : peers) {
    std::string name;
    if (!util::hex_decode(hex, hex.size() / 2, &name))
      return status(errc::invalid_argument, "the start frame's redundancy: an unreadable peer endpoint");
    set->peers.push_back(std::move(name));
  }
  if (key.size() != 64 || !util::hex_decode(key, 32, &set->key))
    return status(errc::invalid_argument, "the start frame's redundancy: the job's key is not 32 bytes in hex");
  if (rec == nullptr) return {};
  util::fields g(*rec, "the start frame's redundancy record");
  g.str("scheme", &set->record_scheme, true, 64);
  g.str("description", &set->record_description, false, 4096);
  g.u32("k", &set->record_k, true, 1024);
  g.u32("m", &set->record_m, true, 1024);
  const nlohmann::json* sets = g.array("sets", true, 1u << 20);
  if (!g.ok()) return g.error();
  for (const auto& e : *sets) {
    std::vector<uint32_t> one;
    if (!e.is_array()) return status(errc::invalid_argument, "the start frame's redundancy record: a set is not an array");
    for (const auto& x : e) {
      if (!x.is_number_unsigned() || x.get<uint64_t>() > INT32_MAX)
        return status(errc::invalid_argument, "the start frame's redundancy record: a member is not a rank");
      one.push_back(static_cast<uint32_t>(x.get<uint64_t>()));
    }
    set->record_sets.push_back(std::move(one));
  }
  set->has_record = true;
  return {};
}

}  // namespace

result<hello_msg> decode_hello(std::string_view meta) {
  return decode<hello_msg>(meta, "hello", [](util::fields& f, hello_msg* m) -> status {
    uint32_t rank = 0;
    uint64_t pid = 0;
    std::string token;
    f.u32("rank", &rank, true, INT32_MAX);
    m->rank = static_cast<int>(rank);
    f.u32("nranks", &m->nranks, true, INT32_MAX);
    if (f.u64("pid", &pid, false, INT32_MAX)) m->pid = static_cast<int>(pid);
    f.str("executable", &m->executable, false, 4096);
    f.str("token", &token, true, 2 * kTokenBytes);
    const nlohmann::json* config = f.object("config");
    if (!f.ok()) return {};
    if (!util::hex_decode(token, kTokenBytes, &m->token))
      return status(errc::invalid_argument, "the hello frame: field 'token' is not " + std::to_string(kTokenBytes) +
                                                " bytes in hex");
    if (config->size() > 1000) return status(errc::invalid_argument, "the hello frame: too many configuration keys");
    for (const auto& item : config->items()) {
      const auto& v = item.value();
      if (!v.is_string() || item.key().size() > 256 || v.get_ref<const std::string&>().size() > 65536)
        return status(errc::invalid_argument, "the hello frame: configuration key '" + item.key().substr(0, 64) +
                                                  "' must be a string of at most 64 KiB");
      m->config[item.key()] = v.get<std::string>();
    }
    return {};
  });
}

result<slot_msg> decode_slot(std::string_view meta) {
  return decode<slot_msg>(meta, "slot", [](util::fields& f, slot_msg* m) {
    f.u64("id", &m->id);
    f.u64("size", &m->size, false, uint64_t{1} << 50);
    return status();
  });
}

result<job_msg> decode_job(std::string_view meta) {
  return decode<job_msg>(meta, "job", [](util::fields& f, job_msg* m) {
    f.u64("id", &m->id);
    f.u64("slot", &m->slot);
    f.u32("wanted", &m->wanted);
    f.num("captured_at", &m->captured_at, false);
    f.num("capture_s", &m->capture_s, false);
    return status();
  });
}

result<committed_msg> decode_committed(std::string_view meta) {
  return decode<committed_msg>(meta, "committed", [](util::fields& f, committed_msg* m) {
    f.str("name", &m->name, true, format::kMaxNameBytes);
    f.i64("version", &m->version, true, 0);
    return status();
  });
}

result<start_msg> decode_start(std::string_view meta) {
  return decode<start_msg>(meta, "start", [](util::fields& f, start_msg* m) -> status {
    const nlohmann::json* r = f.object("redundancy", false);
    if (r == nullptr) return {};
    start_msg::set set;
    CAIRN_RETURN_IF_ERROR(read_set(*r, &set));
    m->redundancy = std::move(set);
    return {};
  });
}

std::string socket_name(uint32_t attempt, const std::string& run, const std::string& node) {
  const std::string key = run + '\n' + node;
  char h[17];
  std::snprintf(h, sizeof h, "%016llx", static_cast<unsigned long long>(util::xxh3(key.data(), key.size())));
  return "cairnd." + std::to_string(attempt) + "." + h;
}

result<int> listen_on(const std::string& name) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return status::from_errno(errno, "node daemon socket");
  socklen_t len;
  sockaddr_un a = address(name, &len);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || listen(fd, 256) != 0) {
    status st = status::from_errno(errno, "node daemon socket '@" + name + "'");
    close(fd);
    return st;
  }
  return fd;
}

status check_peer_user(int fd, const std::string& what) {
  struct ucred cred {};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return status::from_errno(errno, what + ": SO_PEERCRED");
  if (cred.uid != geteuid())
    return {errc::io_error, what + " runs as uid " + std::to_string(cred.uid) + ", not this job's user (uid " +
                                std::to_string(geteuid()) + "): refused"};
  return {};
}

result<int> connect_to(const std::string& name, double timeout_s) {
  const double deadline = util::now_s() + timeout_s;
  for (;;) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return status::from_errno(errno, "node daemon socket");
    socklen_t len;
    sockaddr_un a = address(name, &len);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), len) == 0) {
      if (status st = check_peer_user(fd, "the node daemon at '@" + name + "'"); !st) {
        close(fd);
        return st;
      }
      return fd;
    }
    int e = errno;
    close(fd);
    if ((e != ECONNREFUSED && e != ENOENT) || util::now_s() >= deadline)
      return status::from_errno(e, "connecting to the node daemon at '@" + name + "'");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace cairn::daemon
