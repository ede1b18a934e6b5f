#include "fabric/libfabric.hpp"

#include <dlfcn.h>
#include <signal.h>

#include <atomic>
#include <string>

namespace cairn::fabric {
namespace {

// The soname cairn was built against (libfabric 1.x keeps its ABI within it).
constexpr const char* kLibfabricSoname = "libfabric.so.1";

std::atomic<const libfabric_api*> g_libfabric{nullptr};

// The real entry points; the API's getinfo and fabric call them with the
// dispositions kept.
decltype(libfabric_api::getinfo) g_fi_getinfo = nullptr;
decltype(libfabric_api::fabric) g_fi_fabric = nullptr;

int getinfo_keeping_signals(uint32_t version, const char* node, const char* service, uint64_t flags,
                            const fi_info* hints, fi_info** info) {
  signal_dispositions_kept kept;
  return g_fi_getinfo(version, node, service, flags, hints, info);
}

int fabric_keeping_signals(fi_fabric_attr* attr, fid_fabric** fabric, void* context) {
  signal_dispositions_kept kept;
  return g_fi_fabric(attr, fabric, context);
}

result<const libfabric_api*> load_libfabric() {
  // RTLD_LOCAL: libfabric's symbols stay out of the global namespace, as they
  // would not be there either if the application linked it for its own use.
  signal_dispositions_kept kept;
  void* h = ::dlopen(kLibfabricSoname, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* why = ::dlerror();
    return status(errc::not_supported,
                  std::string("the data planes (checkpoint agents, aggregated flush, redundancy) need libfabric, and ") +
                      kLibfabricSoname + " could not be loaded (" + (why ? why : "unknown reason") +
                      "): install it (Debian: apt-get install libfabric1) or turn those features off");
  }
  static libfabric_api api;
  const char* missing = nullptr;
  auto sym = [&](const char* name) {
    void* p = ::dlsym(h, name);
    if (p == nullptr && missing == nullptr) missing = name;
    return p;
  };
  g_fi_getinfo = reinterpret_cast<decltype(api.getinfo)>(sym("fi_getinfo"));
  api.getinfo = getinfo_keeping_signals;
  api.freeinfo = reinterpret_cast<decltype(api.freeinfo)>(sym("fi_freeinfo"));
  api.dupinfo = reinterpret_cast<decltype(api.dupinfo)>(sym("fi_dupinfo"));
  g_fi_fabric = reinterpret_cast<decltype(api.fabric)>(sym("fi_fabric"));
  api.fabric = fabric_keeping_signals;
  api.strerror = reinterpret_cast<decltype(api.strerror)>(sym("fi_strerror"));
  if (missing != nullptr)
    return status(errc::not_supported, std::string(kLibfabricSoname) + " has no symbol " + missing +
                                           ": it is not the libfabric 1.x cairn was built for");
  return &api;
}

}  // namespace

signal_dispositions_kept::signal_dispositions_kept() {
  for (int s = 1; s < NSIG; ++s) had_[s] = ::sigaction(s, nullptr, &saved_[s]) == 0;
}

signal_dispositions_kept::~signal_dispositions_kept() {
  for (int s = 1; s < NSIG; ++s) {
    struct sigaction now {};
    if (!had_[s] || ::sigaction(s, nullptr, &now) != 0) continue;
    if (now.sa_handler != saved_[s].sa_handler || now.sa_flags != saved_[s].sa_flags)
      (void)::sigaction(s, &saved_[s], nullptr);
  }
}

result<const libfabric_api*> libfabric() {
  static const result<const libfabric_api*> once = [] {
    auto r = load_libfabric();
    if (r) g_libfabric.store(*r, std::memory_order_release);
    return r;
  }();
  return once;
}

const libfabric_api* libfabric_if_loaded() { return g_libfabric.load(std::memory_order_acquire); }

}  // namespace cairn::fabric
