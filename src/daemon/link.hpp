// The application's side of the node daemon (engine_host = daemon,
// docs/design/daemon.md): one connection per rank, over which the rank hands
// each captured version (its staging slot is shared memory the daemon maps)
// to cairnd, which runs the stages and reports each one back.
//
// In the rank's own engine the levels are proxy stages that wait for those
// reports. When the daemon is gone (it died, or never answered), a proxy runs
// the real stage in the process instead, on the same staging slot, so the
// rank carries on with in-process engine threads: a warning, nothing lost.
// Thread-safety: submit/committed/bye from the application thread, wait from
// engine workers; a reader thread takes the daemon's reports.
#ifndef CAIRN_DAEMON_LINK_HPP
#define CAIRN_DAEMON_LINK_HPP

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "daemon/protocol.hpp"
#include "engine/engine.hpp"
#include "util/mutex.hpp"

namespace cairn::daemon {

// What the daemon reported for one stage of one job.
struct stage_report {
  bool gone = false;  // the daemon is gone: run the stage in this process
  status st;          // the daemon's outcome
  double seconds = 0, at = 0, checksum_s = 0, hash_s = 0;
  std::string payload;  // image: the encoded hash trees
};

class link {
 public:
  // Connects (retrying for `timeout_s` while the daemon starts), says hello
  // (`hello`: JSON meta) and waits for the welcome.
  static result<std::shared_ptr<link>> connect(const std::string& name, const std::string& hello, double timeout_s,
                                               int rank);
  ~link();  // says bye unless it did, closes, joins the reader

  bool alive();
  int daemon_pid() const { return pid_; }
  // The address of the session's redundancy plane (bytes, fabric::mailbox::address; empty without redundancy).
  const std::string& plane_address() const { return plane_address_; }
  // Lets the session build its engine; `meta` is the start frame's JSON
  // (the rank's redundancy set and every rank's daemon endpoint, or null).
  status start(const std::string& meta);
  // Hands a captured job to the daemon (the slot's memory file with the
  // first job that uses it). Returns false when the daemon is gone: the
  // proxies then run the stages here.
  bool submit(engine::version_job& job);
  // Blocks until the daemon reports `stage` of the job (or is gone).
  stage_report wait(const engine::version_job& job, const std::string& stage);
  // The application committed (name, version): the daemon has nothing left
  // to commit for it should the application die.
  void committed(const std::string& name, int64_t version);
  // The rank dropped this staging slot (staging_pool::set_on_drop): the
  // daemon unmaps it (if it was ever handed over).
  void release_slot(uint64_t id);
  // The rank is done with the daemon (finalize).
  void bye();
  // The application abandons its pending versions (finalize without
  // waiting): waiters return cancelled instead of waiting for reports the
  // daemon will not send.
  void abandon();

 private:
  link(int fd, int rank) : ch_(fd), rank_(rank) {}
  void reader_main();
  void lost(const std::string& why);  // the daemon is gone: wake every waiter

  channel ch_;
  int rank_;
  int pid_ = 0;
  std::string plane_address_;
  std::thread reader_;
  cairn::mutex mu_;
  cairn::condition_variable cv_;
  bool alive_ CAIRN_GUARDED_BY(mu_) = true;
  bool said_bye_ CAIRN_GUARDED_BY(mu_) = false;
  bool abandoned_ CAIRN_GUARDED_BY(mu_) = false;
  uint64_t next_id_ CAIRN_GUARDED_BY(mu_) = 1;
  std::set<uint64_t> slots_sent_ CAIRN_GUARDED_BY(mu_);
  std::map<std::pair<uint64_t, std::string>, stage_report> reports_ CAIRN_GUARDED_BY(mu_);
};

// The client's stage graph in daemon mode. The image proxy (essential)
// completes the image (checksums, header, hash trees) from the daemon's
// report, or runs `checksum` here; a level proxy waits for `inner`'s level
// from the daemon, or runs `inner` here.
std::unique_ptr<engine::stage> make_image_proxy(std::shared_ptr<link> l, std::unique_ptr<engine::stage> checksum);
std::unique_ptr<engine::stage> make_level_proxy(std::shared_ptr<link> l, std::unique_ptr<engine::stage> inner);
// The fallback of a level the rank cannot reach without the daemon (the
// redundancy level: the other members of its set encode in their daemons):
// fails, without latching, saying why.
std::unique_ptr<engine::stage> make_unreachable_stage(const char* name, unsigned level, std::string why);

}  // namespace cairn::daemon

#endif
