#include "daemon/protocol.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "util/clock.hpp"
#include "util/hash.hpp"
#include <cstdio>

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
  std::lock_guard lk(send_mu_);
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
      return status::from_errno(errno, "node daemon connection");
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        fds_.push_back(fd);
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
  if (len < 5 || len > (1u << 30)) return status(errc::corruption, "node daemon connection: bad frame length");
  CAIRN_RETURN_IF_ERROR(read_exact(head + 4, 5));
  std::memcpy(&meta_len, head + 5, 4);
  if (meta_len > len - 5) return status(errc::corruption, "node daemon connection: bad meta length");
  frame f;
  f.type = static_cast<msg>(head[4]);
  f.meta.resize(meta_len);
  f.payload.resize(len - 5 - meta_len);
  CAIRN_RETURN_IF_ERROR(read_exact(f.meta.data(), f.meta.size()));
  CAIRN_RETURN_IF_ERROR(read_exact(f.payload.data(), f.payload.size()));
  if (f.type == msg::slot) {
    if (fds_.empty()) return status(errc::corruption, "node daemon connection: a slot frame without its memory file");
    f.fd = fds_.front();
    fds_.pop_front();
  }
  return f;
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
