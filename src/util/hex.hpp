// Lower-case hex text of raw bytes: nonces of the agents control plane and the
// endpoint names of the libfabric data plane travel as hex (one codec for both,
// here so that neither module needs the other).
// Thread-safety: every function is safe to call from any thread.
#ifndef CAIRN_UTIL_HEX_HPP
#define CAIRN_UTIL_HEX_HPP

#include <cstddef>
#include <string>
#include <string_view>

namespace cairn::util {

std::string hex_encode(std::string_view bytes);
// Lower- or upper-case hex of exactly `bytes` bytes; false otherwise.
bool hex_decode(std::string_view hex, size_t bytes, std::string* out);

}  // namespace cairn::util

#endif
