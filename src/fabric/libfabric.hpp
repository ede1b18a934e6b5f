// libfabric, loaded on first use (dlopen). libcairn does not link it: a process
// that never opens a data plane (no checkpoint agents, no aggregated flush, no
// redundancy; a single-process Python script) never loads libfabric or its
// providers. Loading them is not free of effects: libpsm2, which Debian's
// libfabric pulls in, installs signal handlers that turn an abort into exit
// status 1 and write a `<prog>.<host>-<pid>,vm.btr` backtrace file into the
// application's working directory.
//
// Loading libfabric and initializing its providers leaves the process's signal
// dispositions as they were (providers such as libpsm2 install handlers that
// would replace the application's).
//
// Only the functions libfabric exports are loaded; everything else in its API
// (fi_domain, fi_recv, fi_read, ...) is an inline call through the objects
// these return. Each symbol is resolved to its default version, the one that
// linking against the same libfabric picks.
// Thread-safety: libfabric() may be called from any thread; it loads once.
#ifndef CAIRN_FABRIC_LIBFABRIC_HPP
#define CAIRN_FABRIC_LIBFABRIC_HPP

#include <cstdint>

#include "cairn/status.hpp"

struct fi_info;
struct fi_fabric_attr;
struct fid_fabric;

namespace cairn::fabric {

struct libfabric_api {
  int (*getinfo)(uint32_t version, const char* node, const char* service, uint64_t flags, const fi_info* hints,
                 fi_info** info);
  void (*freeinfo)(fi_info* info);
  fi_info* (*dupinfo)(const fi_info* info);  // dupinfo(nullptr) is fi_allocinfo
  int (*fabric)(fi_fabric_attr* attr, fid_fabric** fabric, void* context);
  const char* (*strerror)(int errnum);
};

// The loaded API, or not_supported naming the library and what to install.
// The outcome of the first call is kept: a later call does not try again.
result<const libfabric_api*> libfabric();

// The API if it is loaded already, else nullptr (for code that only runs on
// what the loaded API returned, and for error texts).
const libfabric_api* libfabric_if_loaded();

}  // namespace cairn::fabric

#endif
