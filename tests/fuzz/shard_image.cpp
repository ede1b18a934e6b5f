// Fuzz target: a whole shard file as restart reads it (format/shard_io.cpp
// decode_shard_image: the header, re-sealed, then the image, compressed or
// not: zstd frames decompressed, the rebuilt header and every region's
// checksum verified), with the checks restart runs on the header before
// anything is allocated (client/restart_checks.hpp: the shard's identity,
// and no region larger than the one this execution protected).
#include <map>
#include <string>

#include "client/restart_checks.hpp"
#include "format/shard_io.hpp"
#include "fuzz_support.hpp"

using namespace cairn;

namespace {

// What the seeds' job protected (tests/fuzz/make_seeds.cpp): the same names
// and sizes, so that forged lengths meet the check restart makes.
const std::map<std::string, region>& protected_regions() {
  static const std::map<std::string, region> m = [] {
    std::map<std::string, region> out;
    auto add = [&](const char* name, uint8_t type, uint64_t count) {
      region r;
      r.name = name;
      r.type = type;
      r.count = count;
      out[name] = r;
    };
    add("grid", 10 /* double */, 12);
    add("step", 4 /* int64 */, 1);
    add("names", 1 /* uint8 */, 40);
    add("field", 9 /* float */, 24);
    add("zeros", 1 /* uint8 */, 1 << 16);
    return out;
  }();
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string buf(reinterpret_cast<const char*>(data), size);
  fuzz::reseal_shard_header(&buf);
  for (uint32_t rank : {0u, 1u}) {
    const auto identity = format::shard_identity_check("fuzz", rank, 2, "ckpt", 6, nullptr);
    const auto check = [&](const format::shard_header& h) -> status {
      CAIRN_RETURN_IF_ERROR(identity(h));
      return image_fits_regions(h, protected_regions(), "fuzz");
    };
    auto img = format::decode_shard_image(fuzz::bytes(buf), "fuzz", check);
    if (img) break;
  }
  return 0;
}
