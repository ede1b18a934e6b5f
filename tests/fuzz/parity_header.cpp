// Fuzz target: the parity file's header (redundancy/parity_file.cpp), with
// its length and checksum re-sealed over the JSON that follows the prefix.
#include "fuzz_support.hpp"
#include "redundancy/parity_file.hpp"

using namespace cairn;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string buf(reinterpret_cast<const char*>(data), size);
  const size_t prefix = redundancy::kParityPrefix;
  if (buf.size() >= prefix) {
    const uint32_t len = static_cast<uint32_t>(buf.size() - prefix);
    std::memcpy(buf.data() + 12, &len, 4);
    fuzz::put_u64(&buf, 16, util::xxh3(buf.data() + prefix, len));
  }
  (void)redundancy::decode_parity_header(fuzz::bytes(buf), "fuzz");
  return 0;
}
