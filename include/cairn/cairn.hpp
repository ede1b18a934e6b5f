// cairn C++ API: an RAII handle over the same core as the C API (cairn.h).
// Semantics, collectiveness and errors are those of the C functions of the same
// names; every call returns a status or result instead of an int code.
//
// For MPI use include <cairn/mpi.hpp>, which adds client::create_mpi.
#ifndef CAIRN_CAIRN_HPP
#define CAIRN_CAIRN_HPP

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "cairn.h"
#include "cairn/status.hpp"

namespace cairn {
#if defined(__GNUC__)   // exported from libcairn, which hides everything else
#pragma GCC visibility push(default)
#endif

class client_impl;

class client {
 public:
  // Single process. config_path may be empty (environment and defaults only).
  static result<client> create(const std::string& config_path = {});

  client(client&&) noexcept;
  client& operator=(client&&) noexcept;
  // Finalizes without waiting if finalize() was not called.
  ~client();

  int rank() const;
  int size() const;

  status protect(std::string_view region, void* ptr, size_t count, cairn_type_t type);
  status protect(std::string_view region, void* ptr, cairn_type_t type, std::span<const uint64_t> dims,
                 bool column_major = false);
  template <typename T>
  status protect(std::string_view region, std::span<T> data);
  // See cairn_protect_block; mem_shape and mem_start may be empty.
  status protect_block(std::string_view region, void* ptr, cairn_type_t type, std::span<const uint64_t> global_shape,
                       std::span<const uint64_t> start, std::span<const uint64_t> count,
                       std::span<const uint64_t> mem_shape = {}, std::span<const uint64_t> mem_start = {},
                       bool column_major = false);
  status unprotect(std::string_view region);

  status checkpoint(std::string_view name, int64_t version);
  result<unsigned> test(std::string_view name, int64_t version);
  status wait(std::string_view name, int64_t version, unsigned level);
  result<int64_t> restart_test(std::string_view name);
  // See cairn_restart_test_max.
  result<int64_t> restart_test(std::string_view name, int64_t max_version);
  status restart(std::string_view name, int64_t version);
  // See cairn_committed_newest (-1: none).
  result<int64_t> committed_newest(std::string_view name);

  // Remote checkpoint agents: see cairn_probe; the CAIRN_AGENTS_* change.
  result<int> probe();

  // Batch jobs: see cairn_should_checkpoint (collective) and cairn_time_left.
  result<bool> should_checkpoint();
  result<double> time_left();
  // See cairn_advice (local).
  result<cairn_advice_t> advice();
  // See cairn_config_value (local).
  result<std::string> config_value(std::string_view key);

  status set_code_version(std::string_view code_version);
  status tag(std::string_view key, std::string_view value);

  status checkpoint_begin(std::string_view name, int64_t version);
  result<std::string> route_file(std::string_view file);
  status checkpoint_end(bool success);
  status restart_begin(std::string_view name, int64_t version);
  status restart_end(bool success);
  // See cairn_restart_region_size.
  result<uint64_t> restart_region_size(std::string_view region);

  // Waits for (or cancels) pending work and releases the engine; the client is
  // unusable afterwards.
  status finalize(bool wait_for_pending);

  // For the C API and bindings.
  explicit client(std::unique_ptr<client_impl> impl);
  client_impl* impl() { return impl_.get(); }

 private:
  std::unique_ptr<client_impl> impl_;
};

namespace detail {
template <typename T> constexpr cairn_type_t type_of();
template <> constexpr cairn_type_t type_of<int8_t>() { return CAIRN_INT8; }
template <> constexpr cairn_type_t type_of<int16_t>() { return CAIRN_INT16; }
template <> constexpr cairn_type_t type_of<int32_t>() { return CAIRN_INT32; }
template <> constexpr cairn_type_t type_of<int64_t>() { return CAIRN_INT64; }
template <> constexpr cairn_type_t type_of<uint8_t>() { return CAIRN_UINT8; }
template <> constexpr cairn_type_t type_of<uint16_t>() { return CAIRN_UINT16; }
template <> constexpr cairn_type_t type_of<uint32_t>() { return CAIRN_UINT32; }
template <> constexpr cairn_type_t type_of<uint64_t>() { return CAIRN_UINT64; }
template <> constexpr cairn_type_t type_of<float>() { return CAIRN_FLOAT32; }
template <> constexpr cairn_type_t type_of<double>() { return CAIRN_FLOAT64; }
template <> constexpr cairn_type_t type_of<std::byte>() { return CAIRN_BYTE; }
}  // namespace detail

template <typename T>
status client::protect(std::string_view region, std::span<T> data) {
  return protect(region, static_cast<void*>(data.data()), data.size(), detail::type_of<std::remove_const_t<T>>());
}

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif
}  // namespace cairn

#endif  // CAIRN_CAIRN_HPP
