// Fuzz target: the shard header (format/shard.cpp decode_header), re-sealed,
// then what restart does with a decoded header: the region checksums over the
// bytes given, and the plan of a restart on other rank counts (dims, global
// shapes, block starts).
#include <vector>

#include "format/reshard.hpp"
#include "format/shard.hpp"
#include "fuzz_support.hpp"

using namespace cairn;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string buf(reinterpret_cast<const char*>(data), size);
  fuzz::reseal_shard_header(&buf);
  size_t need = 0;
  auto h = format::decode_header(fuzz::bytes(buf), "fuzz", &need);
  if (!h) return 0;
  if (h->file_size <= buf.size()) (void)format::verify_image(*h, fuzz::bytes(buf), "fuzz");
  for (uint32_t n : {1u, 2u, 3u}) {
    std::vector<format::shard_header> old(h->nranks > 0 && h->nranks <= 4 ? h->nranks : 1, *h);
    for (uint32_t r = 0; r < old.size(); ++r) old[r].rank = r;
    (void)format::plan_regions(old, n, "fuzz");
  }
  return 0;
}
