// Log lines of the agents services on stderr:
//   2024-05-01T12:00:00.123Z cairn-controller[4242] warn: <message>
// Rejected control messages are logged through log_rejection, which allows
// at most 20 lines per 10 seconds and then counts what it suppressed, so a
// flood of garbage cannot flood the log.
// Thread-safety: every function may be called from any thread.
#ifndef CAIRN_AGENTS_LOG_HPP
#define CAIRN_AGENTS_LOG_HPP

#include <string>

namespace cairn::agents {

enum class log_level { debug, info, warn, error };

// The service name in every line ("controller", "manager n1"); default "agents".
void set_log_name(const std::string& name);
void set_log_level(log_level min);
void log(log_level level, const std::string& message);
inline void log_info(const std::string& m) { log(log_level::info, m); }
inline void log_warn(const std::string& m) { log(log_level::warn, m); }
inline void log_error(const std::string& m) { log(log_level::error, m); }
// "rejected <what> from <peer>: <code>: <detail>", rate-limited.
void log_rejection(const std::string& peer, const std::string& code, const std::string& detail);

}  // namespace cairn::agents

#endif
