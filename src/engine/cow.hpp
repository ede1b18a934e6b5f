// Copy-on-write capture (capture = cow, docs/design/cow-capture.md): the
// application's regions are write-protected with userfaultfd
// (UFFDIO_WRITEPROTECT) and cairn_checkpoint returns; one thread of cairn then
// copies them into the staging image in the background, and a write by the
// application to a page not copied yet stops at a fault that this thread
// serves first: it copies the page's block (2 MiB, aligned, so a huge page
// stays huge), lifts the protection and the writer goes on. Only the pages a
// region covers whole are protected: the bytes it has on a page it shares
// with other memory (its first and last page, unless it starts or ends on a
// page boundary) are copied by begin, so that writes to the heap's other
// objects there never wait.
//
// The thread is the only server of the faults, so while anything is
// write-protected it writes no memory but its own stack, this unit's control
// block and the staging image (all mapped by cairn, never part of an
// application region: a region may share a page with heap memory the
// application or cairn writes, and a write the thread made there would wait
// for itself), takes no lock the application may hold (no allocation), and
// reads application memory with process_vm_readv, so memory unmapped under it
// fails the version instead of the process.
//
// Where it does not apply (the caller copies those regions itself): memory
// userfaultfd cannot write-protect without a second process seeing writes it
// cannot (MAP_SHARED memory, hugetlbfs, file mappings: register fails and the
// region is copied), memory another userfaultfd watches, and memory written by
// a device (registered RDMA buffers: the NIC does not fault).
//
// Thread-safety: begin, caller_done and drain are called by one thread (the
// client's application thread); done runs once per capture, on cairn's
// thread or inside caller_done.
#ifndef CAIRN_ENGINE_COW_HPP
#define CAIRN_ENGINE_COW_HPP

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cairn/status.hpp"

namespace cairn::engine {

// One region of a capture.
struct cow_region {
  const std::byte* src = nullptr;  // application memory
  uint64_t length = 0;
  std::byte* dst = nullptr;        // where its bytes go (mapped by cairn)
};

// What one capture cost, given to `done`.
struct cow_report {
  double copy_s = 0;        // from the protection to the last byte copied
  uint64_t faults = 0;      // writes that waited for their block
  uint64_t blocks = 0;      // blocks copied in all
};

class cow_capture {
 public:
  using done_fn = std::function<void(status, const cow_report&)>;

  // A userfaultfd that can write-protect anonymous memory, including pages
  // never touched (Linux 6.4), and handle the faults of kernel accesses too
  // (read(2) into a region): the userfaultfd(2) system call where this
  // process may use it, else /dev/userfaultfd. not_supported says why not.
  static result<std::unique_ptr<cow_capture>> make();
  ~cow_capture();  // drains, then stops the thread
  cow_capture(const cow_capture&) = delete;
  cow_capture& operator=(const cow_capture&) = delete;

  // Waits for the previous capture (drain), write-protects what it can of
  // `regions` (regions may overlap or share pages) and returns with the
  // background copy started. Per region: 0 if it is protected and copied in
  // the background, else the errno of why not (EINVAL: memory userfaultfd
  // cannot protect here; EBUSY: another userfaultfd watches it; ...): the
  // caller copies those itself and then calls caller_done. `done` runs once
  // both parts are over, after every protection is lifted: with an error if
  // a region could not be read (unmapped before its copy) or a protection
  // could not be lifted (the application was let go unprotected).
  std::vector<int> begin(std::span<const cow_region> regions, done_fn done);
  // The caller's part of the capture begun last is copied.
  void caller_done();
  // Blocks until the capture begun last has ended and its done returned.
  void drain();
  // Whether a capture is under way (begun, done not returned yet).
  bool busy() const;

  // The block: the unit copied and unprotected at a time (2 MiB).
  static constexpr uint64_t kBlock = uint64_t{2} << 20;

 private:
  struct control;
  struct span_ref {
    uint64_t lo, hi;
    int* error;  // in: why it cannot be protected (0: it may be); out: also why it could not be registered
  };
  explicit cow_capture(int uffd, control* ctl);
  void register_spans(std::vector<span_ref> spans);
  void thread_main();
  void finish_part();

  int uffd_;
  control* ctl_;  // mapped; see the header comment
  // The spans begin checked against /proc/self/maps last, and what it found.
  std::vector<std::pair<uint64_t, uint64_t>> checked_spans_;
  std::vector<int> checked_errors_;
  std::vector<std::pair<uint64_t, uint64_t>> registered_;  // spans registered now
  done_fn done_;
  std::thread thread_;
};

}  // namespace cairn::engine

#endif  // CAIRN_ENGINE_COW_HPP
