// The seal of every data-plane message (docs/design/security.md, "Data
// planes"): a keyed BLAKE2b tag (libsodium crypto_generichash, 16 bytes)
// over a 4-byte context and the message, appended to the message. The
// context binds a message to its receiver (a rank of the job, or the
// direction between an application and its agent), so that a sealed message
// cannot be redirected. Keys are kPlaneKeyBytes random bytes: one per job
// (fabric/mailbox.hpp) or one per application of the agents
// (agents/data_protocol.hpp).
// Thread-safety: free functions, safe from any thread.
#ifndef CAIRN_FABRIC_SEAL_HPP
#define CAIRN_FABRIC_SEAL_HPP

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "cairn/status.hpp"

namespace cairn::fabric {

inline constexpr size_t kPlaneKeyBytes = 32;
inline constexpr size_t kPlaneTagBytes = 16;

// kPlaneKeyBytes random bytes (libsodium randombytes).
result<std::string> new_plane_key();

// message || tag(key, context, message). key: kPlaneKeyBytes.
std::string seal(std::string_view key, uint32_t context, std::string message);
// The message of a sealed one, or nothing when the tag is missing or not
// key's over (context, message).
std::optional<std::string_view> unseal(std::string_view key, uint32_t context, std::string_view sealed);

}  // namespace cairn::fabric

#endif
