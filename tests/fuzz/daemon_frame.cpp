// Fuzz target: what a rank sends the node daemon (daemon/protocol.cpp): the
// bytes go through a socket into channel::recv, frame after frame, and each
// frame's meta through the decoder of every frame type.
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/protocol.hpp"

using namespace cairn;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  (void)daemon::decode_hello(in);
  (void)daemon::decode_slot(in);
  (void)daemon::decode_job(in);
  (void)daemon::decode_committed(in);
  (void)daemon::decode_start(in);
  int sv[2];
  if (size > 60000 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
  if (write(sv[0], data, size) != static_cast<ssize_t>(size)) size = 0;
  close(sv[0]);
  daemon::channel ch(sv[1], daemon::kMaxFrame);
  for (int i = 0; i < 64; ++i) {
    auto f = ch.recv();
    if (!f) break;
    if (f->fd >= 0) close(f->fd);
  }
  return 0;
}
