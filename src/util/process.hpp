// Processes of this host, as cairn judges them from the outside.
#ifndef CAIRN_UTIL_PROCESS_HPP
#define CAIRN_UTIL_PROCESS_HPP

#include <string_view>

namespace cairn::util {

// Known dead without waiting: no process has this pid (in this pid
// namespace), or it is a zombie (killed, not reaped yet), or, where `program`
// is given, the pid was recycled and now runs another program (compared as
// the kernel's comm, cut to 15 bytes). A pid that belongs to another user
// counts as alive: kill(2) cannot tell.
bool pid_gone(int pid, std::string_view program = {});

// Names the calling thread as ps, top, gdb and perf show it ("cairn-engine"):
// the kernel keeps 15 bytes, a longer name is cut.
void name_this_thread(std::string_view name);

}  // namespace cairn::util

#endif
