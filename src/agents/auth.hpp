// Authentication of the agents control plane: the per-deployment secret, the
// HMAC (libsodium crypto_auth_hmacsha512256: HMAC-SHA-512 truncated to 32
// bytes), nonces, and the per-connection session keys. Wire format:
// docs/format/control.md.
// Thread-safety: every function is safe to call from any thread.
#ifndef CAIRN_AGENTS_AUTH_HPP
#define CAIRN_AGENTS_AUTH_HPP

#include <cstddef>
#include <string>
#include <string_view>

#include "cairn/status.hpp"

namespace cairn::agents {

inline constexpr size_t kTagSize = 32;        // bytes of every authentication tag
inline constexpr size_t kNonceSize = 16;      // bytes of a handshake nonce
inline constexpr size_t kMinSecretSize = 16;  // a shorter secret is refused
inline constexpr size_t kMaxSecretSize = 4096;

// Initialises libsodium once; internal error if it cannot (no entropy source).
status crypto_init();

// The deployment secret: the bytes of `path` with trailing whitespace (spaces,
// tabs, CR, LF) removed, so `openssl rand -hex 32 > f` and editors work.
// invalid_argument when the path is empty, the file is missing or unreadable,
// or the secret is shorter than kMinSecretSize or longer than kMaxSecretSize.
// `warning` (if not null) receives a note when the file is readable by group
// or others.
result<std::string> load_secret(const std::string& path, std::string* warning);

// The secret file to use: `option` if not empty, else $CAIRN_AGENTS_SECRET_FILE;
// invalid_argument naming both when neither is set (services refuse to start).
result<std::string> secret_file_from(const std::string& option);

// Both: the secret of the file `option` names (else
// $CAIRN_AGENTS_SECRET_FILE). *path (if given) receives the file's path.
result<std::string> load_deployment_secret(const std::string& option, std::string* warning,
                                           std::string* path = nullptr);

// HMAC-SHA-512-256 of data under key (any key length): 32 bytes.
std::string hmac(std::string_view key, std::string_view data);
// Constant-time comparison of two tags (false when the sizes differ).
bool tag_equal(std::string_view a, std::string_view b);

// kNonceSize random bytes (libsodium randombytes).
std::string random_nonce();

// Per-connection keys after the handshake (docs/format/control.md §handshake):
// HMAC(secret, label || client_nonce || server_nonce) with label
// "cairn-agents c2s v1" (client to server) or "cairn-agents s2c v1".
struct session_keys {
  std::string c2s;
  std::string s2c;
};
session_keys derive_session_keys(std::string_view secret, std::string_view client_nonce,
                                 std::string_view server_nonce);

}  // namespace cairn::agents

#endif
