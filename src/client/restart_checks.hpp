// The restart's checks of a shard header against this execution, run before
// anything of the shard is allocated or read (restart.cpp read_verified).
// Separate so that the fuzz target tests/fuzz/shard_image.cpp runs them on
// forged headers as restart does.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "cairn/status.hpp"
#include "client/client.hpp"
#include "format/shard.hpp"

namespace cairn {

// The image of a header against the protected regions: a region of the
// image that this execution protected may not hold more bytes than the
// protected region (a restore would refuse it after reading, and a forged
// header would make the read allocate what it claims). Regions not protected
// yet (restart_test may come before every protect) are bounded by the node's
// memory only. unusable, naming the region, otherwise.
status image_fits_regions(const format::shard_header& h, const std::map<std::string, region>& regions,
                          const std::string& path);

// An image of `bytes` read or rebuilt into memory must fit in what the node
// has available (checked before it is allocated); no_space, naming `path`,
// otherwise.
status image_fits_memory(uint64_t bytes, const std::string& path);

}  // namespace cairn
