#include "util/process.hpp"

#include <signal.h>
#include <sys/prctl.h>

#include <cerrno>
#include <fstream>
#include <string>

namespace cairn::util {

bool pid_gone(int pid, std::string_view program) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  // Alive, unless a zombie or a recycled pid. (Read as a stream: /proc files
  // have no size.)
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return false;
  const size_t paren = stat.rfind(')');
  if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z') return true;
  const size_t open = stat.find('(');
  if (open == std::string::npos || paren == std::string::npos || paren < open || program.empty()) return false;
  return std::string_view(stat).substr(open + 1, paren - open - 1) != program.substr(0, 15);
}

void name_this_thread(std::string_view name) {
  char comm[16] = {};
  name.copy(comm, sizeof comm - 1);
  (void)::prctl(PR_SET_NAME, comm, 0, 0, 0);
}

}  // namespace cairn::util
