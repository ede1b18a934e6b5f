#include "agents/auth.hpp"

#include <sodium.h>
#include <sys/stat.h>

#include <cstdlib>

#include "storage/storage_env.hpp"

namespace cairn::agents {

status crypto_init() {
  static const int rc = sodium_init();  // thread-safe once; < 0 only without entropy
  if (rc < 0) return {errc::internal, "libsodium could not be initialised (no entropy source?)"};
  return {};
}

result<std::string> load_secret(const std::string& path, std::string* warning) {
  if (path.empty()) return status(errc::invalid_argument, "no secret file given");
  auto data = storage::storage_env::posix()->read_all(path);
  if (!data) {
    return status(errc::invalid_argument,
                  "cannot read the agents secret file " + path + ": " + data.error().message() +
                      " (create it with e.g. `openssl rand -hex 32 > " + path + "; chmod 600 " + path + "`)");
  }
  std::string s = std::move(*data);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) s.pop_back();
  if (s.size() < kMinSecretSize) {
    return status(errc::invalid_argument, "agents secret file " + path + " holds " + std::to_string(s.size()) +
                                              " bytes; at least " + std::to_string(kMinSecretSize) +
                                              " are needed (e.g. `openssl rand -hex 32 > " + path + "`)");
  }
  if (s.size() > kMaxSecretSize) {
    return status(errc::invalid_argument, "agents secret file " + path + " is larger than " +
                                              std::to_string(kMaxSecretSize) + " bytes: is it the right file?");
  }
  struct stat st {};
  if (warning != nullptr && ::stat(path.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    *warning = "agents secret file " + path + " is accessible by group or others (chmod 600 it)";
  }
  return s;
}

result<std::string> secret_file_from(const std::string& option) {
  if (!option.empty()) return option;
  const char* env = std::getenv("CAIRN_AGENTS_SECRET_FILE");
  if (env != nullptr && *env != '\0') return std::string(env);
  return status(errc::invalid_argument,
                "no deployment secret: give --secret-file FILE or set CAIRN_AGENTS_SECRET_FILE "
                "(every controller, manager and client of a deployment must use the same secret)");
}

result<std::string> load_deployment_secret(const std::string& option, std::string* warning, std::string* path) {
  CAIRN_ASSIGN_OR_RETURN(std::string file, secret_file_from(option));
  if (path) *path = file;
  return load_secret(file, warning);
}

std::string hmac(std::string_view key, std::string_view data) {
  crypto_auth_hmacsha512256_state st;
  crypto_auth_hmacsha512256_init(&st, reinterpret_cast<const unsigned char*>(key.data()), key.size());
  crypto_auth_hmacsha512256_update(&st, reinterpret_cast<const unsigned char*>(data.data()), data.size());
  std::string out(crypto_auth_hmacsha512256_BYTES, '\0');
  crypto_auth_hmacsha512256_final(&st, reinterpret_cast<unsigned char*>(out.data()));
  sodium_memzero(&st, sizeof st);
  return out;
}

bool tag_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  return sodium_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string random_nonce() {
  std::string n(kNonceSize, '\0');
  randombytes_buf(n.data(), n.size());
  return n;
}

session_keys derive_session_keys(std::string_view secret, std::string_view client_nonce,
                                 std::string_view server_nonce) {
  std::string nonces = std::string(client_nonce) + std::string(server_nonce);
  return {hmac(secret, "cairn-agents c2s v1" + nonces), hmac(secret, "cairn-agents s2c v1" + nonces)};
}

}  // namespace cairn::agents
