// The C handle and the exception barrier shared by cairn_c.cpp and cairn_mpi.cpp.
#ifndef CAIRN_CAPI_HANDLE_HPP
#define CAIRN_CAPI_HANDLE_HPP

#include <exception>
#include <string>

#include "cairn.h"
#include "cairn/cairn.hpp"

struct cairn_handle {
  explicit cairn_handle(::cairn::client c) : client(std::move(c)) {}
  ::cairn::client client;
};

namespace cairn::capi {

// Records the message for cairn_last_error and returns the C code.
int set_error(const status& st);
int set_error(int code, const std::string& message);

// Runs f (returning status) and converts the outcome, catching stray exceptions.
template <typename F>
int guard(const char* fn, F&& f) noexcept {
  try {
    status st = f();
    return set_error(st);
  } catch (const std::bad_alloc&) {
    return set_error(CAIRN_ENOSPC, std::string(fn) + ": out of memory");
  } catch (const std::exception& e) {
    return set_error(CAIRN_EINTERNAL, std::string(fn) + ": unexpected exception: " + e.what());
  } catch (...) {
    return set_error(CAIRN_EINTERNAL, std::string(fn) + ": unexpected exception");
  }
}

}  // namespace cairn::capi

#endif
