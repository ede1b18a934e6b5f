// No exception leaves a cairn thread (an engine worker, a daemon session): it
// would terminate the application. contained() turns what `f` throws into
// the status it returns.
#ifndef CAIRN_UTIL_CONTAIN_HPP
#define CAIRN_UTIL_CONTAIN_HPP

#include <exception>
#include <new>
#include <string>

#include "cairn/status.hpp"

namespace cairn::util {

// `f` returns a status; `what` names it in the message. bad_alloc becomes
// no_space, anything else internal.
template <class F>
status contained(const char* what, F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return {errc::no_space, std::string(what) + ": out of memory"};
  } catch (const std::exception& e) {
    return {errc::internal, std::string(what) + " failed: " + e.what()};
  } catch (...) {
    return {errc::internal, std::string(what) + " failed with an unknown exception"};
  }
}

}  // namespace cairn::util

#endif
