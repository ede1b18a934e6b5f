// C API (cairn.h) and the C++ client over client_impl.
#include <cstring>

#include "capi/handle.hpp"
#include "client/client.hpp"
#include "engine/engine.hpp"
#include "storage/storage_env.hpp"

// The engine's level bits are the public ones.
static_assert(cairn::engine::kLevelCaptured == CAIRN_LEVEL_CAPTURED && cairn::engine::kLevelLocal == CAIRN_LEVEL_LOCAL &&
              cairn::engine::kLevelProtected == CAIRN_LEVEL_PROTECTED &&
              cairn::engine::kLevelPersistent == CAIRN_LEVEL_PERSISTENT);

namespace cairn {

// ---- C++ API -----------------------------------------------------------------

client::client(std::unique_ptr<client_impl> impl) : impl_(std::move(impl)) {}
client::client(client&&) noexcept = default;
client& client::operator=(client&&) noexcept = default;
client::~client() {
  if (impl_) (void)impl_->finalize(false);
}

result<client> client::create(const std::string& config_path) {
  CAIRN_ASSIGN_OR_RETURN(auto impl, client_impl::create(comm::make_serial(), config_path));
  return client(std::move(impl));
}

namespace {
status finalized_error() { return {errc::invalid_argument, "the handle was finalized"}; }
}  // namespace

#define CAIRN_IMPL_OR_FAIL() \
  if (!impl_) return finalized_error()

int client::rank() const { return impl_ ? impl_->rank() : 0; }
int client::size() const { return impl_ ? impl_->size() : 1; }

status client::protect(std::string_view name, void* ptr, size_t count, cairn_type_t type) {
  CAIRN_IMPL_OR_FAIL();
  region r;
  r.name = std::string(name);
  r.ptr = ptr;
  r.count = count;
  r.type = static_cast<uint8_t>(type);
  return impl_->protect(std::move(r));
}

status client::protect(std::string_view name, void* ptr, cairn_type_t type, std::span<const uint64_t> dims,
                       bool column_major) {
  CAIRN_IMPL_OR_FAIL();
  region r;
  r.name = std::string(name);
  r.ptr = ptr;
  r.type = static_cast<uint8_t>(type);
  r.dims.assign(dims.begin(), dims.end());
  r.count = 1;
  for (auto d : dims) r.count *= d;
  if (dims.empty()) return {errc::invalid_argument, "region '" + r.name + "': a shape needs at least one dimension"};
  r.column_major = column_major;
  return impl_->protect(std::move(r));
}

status client::protect_block(std::string_view name, void* ptr, cairn_type_t type, std::span<const uint64_t> global_shape,
                             std::span<const uint64_t> start, std::span<const uint64_t> count,
                             std::span<const uint64_t> mem_shape, std::span<const uint64_t> mem_start,
                             bool column_major) {
  CAIRN_IMPL_OR_FAIL();
  if (count.empty() || count.size() > CAIRN_MAX_DIMS || global_shape.size() != count.size() ||
      start.size() != count.size() || mem_shape.size() != mem_start.size() ||
      (!mem_shape.empty() && mem_shape.size() != count.size()))
    return {errc::invalid_argument, "region '" + std::string(name) +
                                        "': global shape, start, count (and memory shape, start) need 1 to 8 equal dimensions"};
  region r;
  r.name = std::string(name);
  r.ptr = ptr;
  r.type = static_cast<uint8_t>(type);
  r.dims.assign(count.begin(), count.end());
  r.count = 1;
  for (auto d : count) r.count *= d;
  r.column_major = column_major;
  r.global.assign(global_shape.begin(), global_shape.end());
  r.start.assign(start.begin(), start.end());
  r.mem_shape.assign(mem_shape.begin(), mem_shape.end());
  r.mem_start.assign(mem_start.begin(), mem_start.end());
  return impl_->protect(std::move(r));
}

status client::unprotect(std::string_view n) { CAIRN_IMPL_OR_FAIL(); return impl_->unprotect(std::string(n)); }
status client::checkpoint(std::string_view n, int64_t v) { CAIRN_IMPL_OR_FAIL(); return impl_->checkpoint(std::string(n), v); }
result<unsigned> client::test(std::string_view n, int64_t v) { CAIRN_IMPL_OR_FAIL(); return impl_->test(std::string(n), v); }
status client::wait(std::string_view n, int64_t v, unsigned l) { CAIRN_IMPL_OR_FAIL(); return impl_->wait(std::string(n), v, l); }
result<int64_t> client::restart_test(std::string_view n) { CAIRN_IMPL_OR_FAIL(); return impl_->restart_test(std::string(n)); }
result<int64_t> client::restart_test(std::string_view n, int64_t max_version) {
  CAIRN_IMPL_OR_FAIL();
  return impl_->restart_test(std::string(n), max_version);
}
result<int64_t> client::committed_newest(std::string_view n) {
  CAIRN_IMPL_OR_FAIL();
  return impl_->committed_newest(std::string(n));
}
result<uint64_t> client::restart_region_size(std::string_view r) {
  CAIRN_IMPL_OR_FAIL();
  return impl_->restart_region_size(std::string(r));
}
result<int> client::probe() { CAIRN_IMPL_OR_FAIL(); return impl_->probe(); }
result<bool> client::should_checkpoint() { CAIRN_IMPL_OR_FAIL(); return impl_->should_checkpoint(); }
result<cairn_advice_t> client::advice() { CAIRN_IMPL_OR_FAIL(); return impl_->advice(); }
result<double> client::time_left() { CAIRN_IMPL_OR_FAIL(); return impl_->time_left(); }
result<std::string> client::config_value(std::string_view key) {
  CAIRN_IMPL_OR_FAIL();
  const auto values = impl_->cfg().values();
  if (auto it = values.find(std::string(key)); it != values.end()) return it->second;
  return status(errc::not_found, "no configuration key '" + std::string(key) +
                                     "' (docs/design/core.md lists the keys)");
}
status client::restart(std::string_view n, int64_t v) { CAIRN_IMPL_OR_FAIL(); return impl_->restart(std::string(n), v); }
status client::set_code_version(std::string_view v) { CAIRN_IMPL_OR_FAIL(); return impl_->set_code_version(std::string(v)); }
status client::tag(std::string_view k, std::string_view v) { CAIRN_IMPL_OR_FAIL(); return impl_->tag(std::string(k), std::string(v)); }
status client::checkpoint_begin(std::string_view n, int64_t v) { CAIRN_IMPL_OR_FAIL(); return impl_->checkpoint_begin(std::string(n), v); }
result<std::string> client::route_file(std::string_view f) { CAIRN_IMPL_OR_FAIL(); return impl_->route_file(std::string(f)); }
status client::checkpoint_end(bool ok) { CAIRN_IMPL_OR_FAIL(); return impl_->checkpoint_end(ok); }
status client::restart_begin(std::string_view n, int64_t v) { CAIRN_IMPL_OR_FAIL(); return impl_->restart_begin(std::string(n), v); }
status client::restart_end(bool ok) { CAIRN_IMPL_OR_FAIL(); return impl_->restart_end(ok); }

status client::finalize(bool wait_for_pending) {
  CAIRN_IMPL_OR_FAIL();
  status st = impl_->finalize(wait_for_pending);
  impl_.reset();
  return st;
}

// ---- C API error plumbing -------------------------------------------------------

namespace capi {
namespace {
thread_local std::string last_error;
}
int set_error(const status& st) {
  if (st.is_ok()) return CAIRN_OK;
  last_error = st.message();
  return static_cast<int>(st.code());
}
int set_error(int code, const std::string& message) {
  last_error = message;
  return code;
}
const char* last() { return last_error.c_str(); }
}  // namespace capi

}  // namespace cairn

using cairn::errc;
using cairn::status;
using cairn::capi::guard;

#define CAIRN_CHECK_HANDLE(c) \
  if ((c) == nullptr) return status(errc::invalid_argument, std::string(__func__) + ": handle is NULL")

namespace {

// Copies `s` with its terminating NUL into the caller's buffer of `len` bytes,
// or says how many it needs (`what` names the value).
status copy_out(const std::string& s, char* out, size_t len, const std::string& what) {
  if (s.size() + 1 > len)
    return {errc::invalid_argument,
            what + " needs " + std::to_string(s.size() + 1) + " bytes, the buffer has " + std::to_string(len)};
  std::memcpy(out, s.c_str(), s.size() + 1);
  return {};
}

}  // namespace

extern "C" {

int cairn_init(const char* config_path, cairn_t** out) {
  return guard(__func__, [&]() -> status {
    if (out == nullptr) return {errc::invalid_argument, "cairn_init: out is NULL"};
    *out = nullptr;
    CAIRN_ASSIGN_OR_RETURN(auto cl, cairn::client::create(config_path ? config_path : ""));
    *out = new cairn_t(std::move(cl));
    return {};
  });
}

int cairn_protect(cairn_t* c, const char* region, void* ptr, size_t count, cairn_type_t type) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    if (region == nullptr) return {errc::invalid_argument, "cairn_protect: region name is NULL"};
    return c->client.protect(region, ptr, count, type);
  });
}

int cairn_protect_shaped(cairn_t* c, const char* region, void* ptr, cairn_type_t type, int ndims,
                         const uint64_t* dims, int column_major) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    if (region == nullptr || dims == nullptr || ndims < 1 || ndims > CAIRN_MAX_DIMS)
      return {errc::invalid_argument, "cairn_protect_shaped: need a region name and 1 to 8 dimensions"};
    return c->client.protect(region, ptr, type, std::span<const uint64_t>(dims, static_cast<size_t>(ndims)),
                             column_major != 0);
  });
}

int cairn_protect_block(cairn_t* c, const char* region, void* ptr, cairn_type_t type, int ndims,
                        const uint64_t* global_shape, const uint64_t* start, const uint64_t* count,
                        const uint64_t* mem_shape, const uint64_t* mem_start, int column_major) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    if (region == nullptr || ndims < 1 || ndims > CAIRN_MAX_DIMS || !global_shape || !start || !count ||
        (mem_shape == nullptr) != (mem_start == nullptr))
      return {errc::invalid_argument,
              "cairn_protect_block: need a region name, 1 to 8 dimensions, global_shape, start and count "
              "(mem_shape and mem_start both or neither)"};
    auto n = static_cast<size_t>(ndims);
    auto sp = [n](const uint64_t* p) { return p ? std::span<const uint64_t>(p, n) : std::span<const uint64_t>(); };
    return c->client.protect_block(region, ptr, type, sp(global_shape), sp(start), sp(count), sp(mem_shape),
                                   sp(mem_start), column_major != 0);
  });
}

int cairn_unprotect(cairn_t* c, const char* region) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    if (region == nullptr) return {errc::invalid_argument, "cairn_unprotect: region name is NULL"};
    return c->client.unprotect(region);
  });
}

#define CAIRN_CHECK_NAME(name) \
  if ((name) == nullptr) return status(errc::invalid_argument, std::string(__func__) + ": name is NULL")

int cairn_checkpoint(cairn_t* c, const char* name, int64_t version) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    CAIRN_CHECK_NAME(name);
    return c->client.checkpoint(name, version);
  });
}

int cairn_test(cairn_t* c, const char* name, int64_t version, unsigned* levels_reached) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    CAIRN_CHECK_NAME(name);
    if (levels_reached == nullptr) return {errc::invalid_argument, "cairn_test: levels_reached is NULL"};
    *levels_reached = 0;
    CAIRN_ASSIGN_OR_RETURN(*levels_reached, c->client.test(name, version));
    return {};
  });
}

int cairn_wait(cairn_t* c, const char* name, int64_t version, unsigned level) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    CAIRN_CHECK_NAME(name);
    return c->client.wait(name, version, level);
  });
}

int cairn_restart_test(cairn_t* c, const char* name, int64_t* version) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    CAIRN_CHECK_NAME(name);
    if (version == nullptr) return {errc::invalid_argument, "cairn_restart_test: version is NULL"};
    *version = -1;
    CAIRN_ASSIGN_OR_RETURN(*version, c->client.restart_test(name));
    return {};
  });
}

int cairn_restart_test_max(cairn_t* c, const char* name, int64_t max_version, int64_t* version) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    CAIRN_CHECK_NAME(name);
    if (version == nullptr) return {errc::invalid_argument, "cairn_restart_test_max: version is NULL"};
    if (max_version < 0) return {errc::invalid_argument, "cairn_restart_test_max: max_version must be >= 0"};
    *version = -1;
    CAIRN_ASSIGN_OR_RETURN(*version, c->client.restart_test(name, max_version));
    return {};
  });
}

int cairn_committed_newest(cairn_t* c, const char* name, int64_t* version) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    CAIRN_CHECK_NAME(name);
    if (version == nullptr) return {errc::invalid_argument, "cairn_committed_newest: version is NULL"};
    *version = -1;
    CAIRN_ASSIGN_OR_RETURN(*version, c->client.committed_newest(name));
    if (*version < 0) return {errc::not_found, "no committed version of '" + std::string(name) + "' in this run"};
    return {};
  });
}

int cairn_restart(cairn_t* c, const char* name, int64_t version) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    CAIRN_CHECK_NAME(name);
    return c->client.restart(name, version);
  });
}

int cairn_finalize(cairn_t** c, int wait_for_pending) {
  return guard(__func__, [&]() -> status {
    if (c == nullptr || *c == nullptr) return {errc::invalid_argument, "cairn_finalize: handle is NULL"};
    status st = (*c)->client.finalize(wait_for_pending != 0);
    delete *c;
    *c = nullptr;
    return st;
  });
}

void cairn_io_counters(cairn_io_counters_t* out) {
  if (!out) return;
  const cairn::storage::io_counters c = cairn::storage::posix_io_counters();
  out->creates = c.creates;
  out->opens = c.opens;
  out->fsyncs = c.syncs;
  out->renames = c.renames;
  out->dir_fsyncs = c.dir_syncs;
  out->mkdirs = c.mkdirs;
  out->removes = c.removes;
  out->bytes_written = c.bytes_written;
}

const char* cairn_strerror(int code) {
  switch (code) {
    case CAIRN_OK: return "success";
    case CAIRN_EINVAL: return "invalid argument";
    case CAIRN_ENOTFOUND: return "not found";
    case CAIRN_ECORRUPT: return "corrupt data";
    case CAIRN_EIO: return "I/O error";
    case CAIRN_ENOSPC: return "no space left";
    case CAIRN_EAGAIN: return "staging memory full, try again";
    case CAIRN_ECANCELLED: return "cancelled";
    case CAIRN_ENOTSUP: return "not supported";
    case CAIRN_EINTERNAL: return "internal error";
    case CAIRN_EDIVERGED: return "diverged from the reference run";
    case CAIRN_EUNUSABLE: return "checkpoints exist but this job cannot restore them";
    case CAIRN_EEXIST: return "version already committed in this run";
    case CAIRN_EEARLIER: return "this version was taken, but an earlier version failed";
    case CAIRN_EBUSY: return "another execution is writing this run";
  }
  return "unknown error code";
}

const char* cairn_last_error(void) { return cairn::capi::last(); }

int cairn_set_code_version(cairn_t* c, const char* code_version) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    if (code_version == nullptr) return {errc::invalid_argument, "cairn_set_code_version: NULL"};
    return c->client.set_code_version(code_version);
  });
}

int cairn_tag(cairn_t* c, const char* key, const char* value) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    if (key == nullptr || value == nullptr) return {errc::invalid_argument, "cairn_tag: NULL key or value"};
    return c->client.tag(key, value);
  });
}

int cairn_divergence(cairn_t* c, cairn_divergence_t* info) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    if (info == nullptr) return {errc::invalid_argument, "cairn_divergence: info is NULL"};
    if (!c->client.impl()) return {errc::invalid_argument, "cairn_divergence: the handle was finalized"};
    return c->client.impl()->divergence(info);
  });
}

int cairn_probe(cairn_t* c, int* change) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    if (change == nullptr) return {errc::invalid_argument, "cairn_probe: change is NULL"};
    *change = CAIRN_AGENTS_UNCHANGED;
    CAIRN_ASSIGN_OR_RETURN(*change, c->client.probe());
    return {};
  });
}

int cairn_should_checkpoint(cairn_t* c, int* yes) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    if (yes == nullptr) return {errc::invalid_argument, "cairn_should_checkpoint: yes is NULL"};
    *yes = 0;
    CAIRN_ASSIGN_OR_RETURN(bool y, c->client.should_checkpoint());
    *yes = y ? 1 : 0;
    return {};
  });
}

int cairn_time_left(cairn_t* c, double* seconds) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    if (seconds == nullptr) return {errc::invalid_argument, "cairn_time_left: seconds is NULL"};
    CAIRN_ASSIGN_OR_RETURN(*seconds, c->client.time_left());
    return {};
  });
}

int cairn_config_value(cairn_t* c, const char* key, char* value, size_t len) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    if (key == nullptr || value == nullptr) return {errc::invalid_argument, "cairn_config_value: NULL argument"};
    CAIRN_ASSIGN_OR_RETURN(std::string v, c->client.config_value(key));
    return copy_out(v, value, len, "cairn_config_value: the value of '" + std::string(key) + "'");
  });
}

int cairn_advice(cairn_t* c, cairn_advice_t* advice) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    if (advice == nullptr) return {errc::invalid_argument, "cairn_advice: advice is NULL"};
    *advice = cairn_advice_t{};
    CAIRN_ASSIGN_OR_RETURN(*advice, c->client.advice());
    return {};
  });
}

int cairn_rank(const cairn_t* c) { return c ? c->client.rank() : 0; }
int cairn_size(const cairn_t* c) { return c ? c->client.size() : 1; }

int cairn_checkpoint_begin(cairn_t* c, const char* name, int64_t version) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    CAIRN_CHECK_NAME(name);
    return c->client.checkpoint_begin(name, version);
  });
}

int cairn_route_file(cairn_t* c, const char* file, char* routed, size_t routed_len) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    if (file == nullptr || routed == nullptr) return {errc::invalid_argument, "cairn_route_file: NULL argument"};
    CAIRN_ASSIGN_OR_RETURN(std::string path, c->client.route_file(file));
    return copy_out(path, routed, routed_len, "cairn_route_file: routed path");
  });
}

int cairn_checkpoint_end(cairn_t* c, int success) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    return c->client.checkpoint_end(success != 0);
  });
}

int cairn_restart_begin(cairn_t* c, const char* name, int64_t version) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    CAIRN_CHECK_NAME(name);
    return c->client.restart_begin(name, version);
  });
}

int cairn_restart_end(cairn_t* c, int success) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    return c->client.restart_end(success != 0);
  });
}

int cairn_restart_region_size(cairn_t* c, const char* region, uint64_t* bytes) {
  return guard(__func__, [&]() -> status {
    CAIRN_CHECK_HANDLE(c);
    if (region == nullptr || bytes == nullptr) return {errc::invalid_argument, "cairn_restart_region_size: NULL argument"};
    CAIRN_ASSIGN_OR_RETURN(*bytes, c->client.restart_region_size(region));
    return {};
  });
}

}  // extern "C"
