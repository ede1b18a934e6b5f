// Fuzz target: the hash-tree file (format/tree.cpp decode_tree), re-sealed
// (its last 8 bytes are the xxh3 of the rest).
#include "format/tree.hpp"
#include "fuzz_support.hpp"

using namespace cairn;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string buf(reinterpret_cast<const char*>(data), size);
  if (buf.size() >= 8) fuzz::put_u64(&buf, buf.size() - 8, util::xxh3(buf.data(), buf.size() - 8));
  (void)format::decode_tree(fuzz::bytes(buf), "fuzz");
  return 0;
}
