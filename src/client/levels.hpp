// The levels a configuration registers (docs/design/levels.md).
#ifndef CAIRN_CLIENT_LEVELS_HPP
#define CAIRN_CLIENT_LEVELS_HPP

#include <memory>
#include <vector>

#include "client/level.hpp"

namespace cairn {

// Local: the levels host's configuration asks for, in the order the client
// asks them; invalid_argument when the configuration combines levels that
// do not go together.
result<std::vector<std::unique_ptr<level>>> make_levels(level_host* host);

}  // namespace cairn

#endif
