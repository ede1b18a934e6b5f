// Authentication of the agents control plane: the per-deployment secret, the
// HMAC (libsodium crypto_auth_hmacsha512256: HMAC-SHA-512 truncated to 32
// bytes), nonces, and the per-connection session keys. Wire format:
// docs/format/control.md.
// Thread-safety: every function is safe to call from any thread.
#ifndef CAIRN_AGENTS_AUTH_HPP
#define CAIRN_AGENTS_AUTH_HPP

#include <cstddef>
#include <cstdint>
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

// The service secret (controller and managers; docs/design/security.md,
// "Agents"): the file `option` names, else $CAIRN_AGENTS_SERVICE_SECRET_FILE;
// empty when neither is set (the deployment secret then serves for both).
result<std::string> load_service_secret(const std::string& option, std::string* warning);

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

// An X25519 key pair (crypto_box_keypair), raw bytes.
struct box_keypair {
  std::string public_key;
  std::string secret_key;
};
box_keypair new_box_keypair();

// Per-connection cipher keys (docs/format/control.md, "Handshake and keys"):
// each side draws a key pair for the connection (new_box_keypair) and sends
// its public half in the hello or hello_ack it tags with the secret;
// libsodium's crypto_kx derives one key per direction (c2s, s2c) from both.
// Every party holds the secret, so the tag keys above are known to anyone who
// saw the nonces; these only to the two ends. invalid_argument for a peer key
// of another size or one that yields no shared key (a low-order point).
result<session_keys> client_cipher_keys(const box_keypair& mine, std::string_view server_public);
result<session_keys> server_cipher_keys(const box_keypair& mine, std::string_view client_public);
// `payload` XOR ChaCha20 (IETF) under `key` with the 12-byte nonce: `seq`
// little-endian, then four zero bytes. It encrypts and decrypts; each key
// serves one direction of one connection, whose sequence numbers never repeat.
std::string cipher_xor(std::string_view key, uint64_t seq, std::string_view payload);

// ---- application keys (docs/design/security.md, "Agents") ----------------------
// Every application has its own key for its data plane with its agents
// (agents/data_protocol.hpp "the seal"), drawn by the controller. Every party
// of the control plane holds the deployment secret and could derive another
// connection's session keys from the nonces it saw, so the key never travels
// under them: it goes to the application and to its agents' managers in a
// sealed box (libsodium crypto_box_seal) to a key pair they drew for it.
inline constexpr size_t kAppKeySize = 32;
inline constexpr size_t kBoxPublicKeySize = 32;  // crypto_box_PUBLICKEYBYTES

// kAppKeySize random bytes.
std::string new_app_key();

// crypto_box_seal of `message` to `public_key` (crypto_box_PUBLICKEYBYTES);
// invalid_argument for a key of another size.
result<std::string> seal_to(std::string_view public_key, std::string_view message);
// Opens a sealed box with the key pair; invalid_argument when it is not one
// sealed to that public key.
result<std::string> open_sealed(const box_keypair& kp, std::string_view box);

// What proves, at a re-registration, that the client holds the application's
// key: a keyed BLAKE2b (32 bytes) over the name and the public key the reply
// is sealed to (so a proof seen on the wire is of no use with any other key).
std::string app_key_proof(std::string_view app_key, std::string_view name, std::string_view public_key);

// What an application's later requests (progress, resize, unregister)
// carry to show they come from it: a keyed BLAKE2b (32 bytes) over the
// controller's id for it, the connection's binding (net.hpp: both handshake
// nonces) and the request's type name. The control plane does not encrypt,
// so a proof is seen on the wire; bound to its connection and request, it is
// of no use in any other.
std::string app_request_proof(std::string_view app_key, uint64_t app, std::string_view binding,
                              std::string_view request);

// Where a run keeps its application key for its next jobs:
// <store>/runs/<run>/agents.key (hex, mode 600).
std::string app_key_file(const std::string& store, const std::string& run);
// The key in `path`; empty when there is none (or it is not 32 bytes of hex).
std::string load_app_key(const std::string& path);
// Writes `key` to `path` as hex, mode 600 from its creation, durably
// (fsync, rename, directory sync); creates the directory.
status save_app_key(const std::string& path, std::string_view key);

}  // namespace cairn::agents

#endif
