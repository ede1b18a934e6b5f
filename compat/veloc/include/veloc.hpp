// The VELOC drop-in's C++ API (docs/design/compat.md): VELOC's veloc.hpp,
// over the same library as its C API (veloc.h, libveloc-client). A VELOC C++
// application builds against cairn with -I<prefix>/include -L<prefix>/lib
// -lveloc-client.
//
// Regions are raw memory (mem_protect with a pointer) or data structures
// written and read through a serializer / deserializer pair (std::ostream /
// std::istream), each in a named group: a checkpoint called `name` captures
// the group `name` if it has regions, else the group "default". Observers of
// VELOC_OBSERVE_CKPT_END are called after each checkpoint_end.
// One client per process (get_client returns the same one again); deleting
// it waits for the checkpoints in flight and ends the library (VELOC_Finalize),
// before MPI_Finalize. A client never deleted is never finalized, as with the
// C API without VELOC_Finalize.
// Thread-safety: one thread at a time, as VELOC's.
#ifndef VELOC_HPP
#define VELOC_HPP

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <iostream>
#include <set>
#include <string>

#include "veloc.h"
#include "veloc/defs.h"

namespace veloc {

class client_t {
 public:
  static constexpr char default_mem_group[] = "default";
  using serializer_t = std::function<void(std::ostream&)>;
  using deserializer_t = std::function<bool(std::istream&)>;
  using observer_t = std::function<void(const std::string& name, int version)>;

  virtual bool mem_protect(int id, void* ptr, size_t count, size_t base_size,
                           const std::string& name = default_mem_group) = 0;
  virtual bool mem_protect(int id, const serializer_t& s, const deserializer_t& d,
                           const std::string& name = default_mem_group) = 0;
  virtual bool mem_unprotect(int id, const std::string& name = default_mem_group) = 0;
  virtual void mem_clear(const std::string& name = default_mem_group) = 0;
  virtual bool register_observer(int type, const observer_t& obs) = 0;

  virtual std::string route_file(const std::string& original) = 0;
  virtual bool cleanup(const std::string& name) = 0;

  virtual bool checkpoint(const std::string& name, int version) = 0;
  virtual bool checkpoint_begin(const std::string& name, int version) = 0;
  virtual bool checkpoint_mem(int mode, const std::set<int>& ids) = 0;
  virtual bool checkpoint_end(bool success) = 0;
  virtual bool checkpoint_wait() = 0;
  virtual bool checkpoint_finished() = 0;

  // target_rank other than -1 (restoring another rank's checkpoint) is not
  // provided: VELOC_FAILURE / false with a message.
  virtual int restart_test(const std::string& name, int version, int target_rank = -1) = 0;
  virtual bool restart(const std::string& name, int version, int target_rank = -1) = 0;
  virtual bool restart_begin(const std::string& name, int version, int target_rank = -1) = 0;
  virtual size_t recover_size(int id) = 0;
  virtual bool recover_mem(int mode, const std::set<int>& ids) = 0;
  virtual bool restart_end(bool success) = 0;

  virtual ~client_t() = 0;
};

// nullptr (the reason on stderr) when the library cannot start.
client_t* get_client(unsigned int id, const std::string& cfg_file);
client_t* get_client(MPI_Comm comm, const std::string& cfg_file);

}  // namespace veloc

#endif
