// A set's blocks pulled over its data plane window by window, and the parity
// a member holds encoded from them: shared by the encoding stage (stage.cpp,
// an engine thread, at checkpoint) and the rebuild (client/redundancy_level.cpp,
// the application thread, at restart). libfabric builds.
#ifndef CAIRN_REDUNDANCY_CODING_HPP
#define CAIRN_REDUNDANCY_CODING_HPP

#include <cstdint>
#include <functional>
#include <vector>

#include "cairn/status.hpp"
#include "fabric/mailbox.hpp"
#include "redundancy/parity_file.hpp"
#include "redundancy/sets.hpp"
#include "util/aligned_buffer.hpp"

namespace cairn::redundancy {

// The redundancy data plane: a mailbox of its own (fabric/mailbox.hpp), so
// its messages never mix with the aggregated flush's. Used by one thread at
// a time: the stage (engine) or the rebuild (application thread, at restart).
using plane = fabric::mailbox;
using plane_options = fabric::mailbox_options;

// Bytes of each block pulled and coded at a time.
inline constexpr uint64_t kWindow = 8 << 20;

// One window of a stripe: a read per block (the stripe's d inputs); a read
// shorter than n (a padded chunk's end) reads as zeros after its bytes.
struct window_reads {
  uint64_t n = 0;
  std::vector<fabric::mailbox::read> reads;  // `local` is set by pull_windows
};

// The two sets of d window buffers pull_windows reads into, kept by the
// caller from one call to the next (fresh memory is costly to fault in).
struct window_buffers {
  std::vector<util::aligned_buffer> set[2];
};

// For each window in order: its reads pulled side by side from their ranks
// into d buffers of *bufs (made or grown as needed), then use(k, blocks) with
// the d blocks of window k. The next window is pulled while `use` codes this
// one.
status pull_windows(plane& p, std::vector<window_reads>& windows, uint32_t d, window_buffers* bufs,
                    const std::function<status(size_t k, const unsigned char* const* blocks)>& use);

// A member's shard image as its set exposes it (READY, or the rebuild's exchange).
struct exposed_image {
  uint32_t rank = 0;
  uint64_t addr = 0, key = 0, length = 0;
};

// The parity blocks that position `pos` of g holds, encoded from the images
// of its stripes' contributors (`img` in set order; only theirs are read):
// one entry in *blocks (stripe, row, length, checksum) and one buffer in *out
// per block, in the order of the parity file. `per_window` runs after each
// window is encoded (a test hook).
status encode_held(plane& p, const geometry& g, uint32_t pos, const std::vector<exposed_image>& img,
                   std::vector<block>* blocks, std::vector<util::aligned_buffer>* out,
                   const std::function<void()>& per_window = {});

}  // namespace cairn::redundancy

#endif
