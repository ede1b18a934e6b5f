// libfabric, loaded on first use (dlopen). libcairn does not link it: a process
// that never opens a data plane (no checkpoint agents, no aggregated flush, no
// redundancy; a single-process Python script) never loads libfabric or its
// providers. Loading them is not free of effects: libpsm2, which Debian's
// libfabric pulls in, installs signal handlers that turn an abort into exit
// status 1 and write a `<prog>.<host>-<pid>,vm.btr` backtrace file into the
// application's working directory.
//
// Loading libfabric and initializing its providers leaves the process's signal
// dispositions as they were (signal_dispositions_kept; fabric_context::create
// keeps them around the endpoint's creation too).
//
// Only the functions libfabric exports are loaded; everything else in its API
// (fi_domain, fi_recv, fi_read, ...) is an inline call through the objects
// these return. Each symbol is resolved to its default version, the one that
// linking against the same libfabric picks.
// Thread-safety: libfabric() may be called from any thread; it loads once.
#ifndef CAIRN_FABRIC_LIBFABRIC_HPP
#define CAIRN_FABRIC_LIBFABRIC_HPP

#include <signal.h>

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

// Undoes, at the end of its scope, every change made to the process's signal
// dispositions during it. Loading libfabric runs its providers' constructors,
// fi_getinfo and fi_fabric initialize providers, and fi_endpoint opens one:
// libpsm2 and libinfinipath install handlers for SIGTERM, SIGINT, SIGSEGV,
// SIGABRT and others that end the process with status 1 and a backtrace file;
// shm (libfabric 1.17, at fi_endpoint) installs handlers for SIGTERM, SIGINT,
// SIGSEGV and SIGBUS that unlink its regions, put the old disposition back and
// return, so that a first SIGTERM of a process with the default disposition no
// longer ends it. Installed that late (not before main, as when an application
// links libfabric itself), they would replace the application's own handlers
// and cairn's (batch system warnings). What this costs: a process ended by one
// of those signals leaves its shm regions in /dev/shm, as SIGKILL does anyway
// (the next process's first shm endpoint removes them: fabric.hpp,
// remove_dead_shm_regions).
// Thread-safety: a change another thread makes to a disposition inside the
// scope is undone too.
class signal_dispositions_kept {
 public:
  signal_dispositions_kept();
  ~signal_dispositions_kept();
  signal_dispositions_kept(const signal_dispositions_kept&) = delete;
  signal_dispositions_kept& operator=(const signal_dispositions_kept&) = delete;

 private:
  struct sigaction saved_[NSIG] {};
  bool had_[NSIG] {};
};

// The loaded API, or not_supported naming the library and what to install.
// The outcome of the first call is kept: a later call does not try again.
result<const libfabric_api*> libfabric();

// The API if it is loaded already, else nullptr (for code that only runs on
// what the loaded API returned, and for error texts).
const libfabric_api* libfabric_if_loaded();

}  // namespace cairn::fabric

#endif
