// Fuzz target: the sealed JSON files of a store (MANIFEST with its container
// index, part records, RUN), re-sealed. The first byte picks the decoder.
#include "format/manifest.hpp"
#include "format/run_info.hpp"
#include "fuzz_support.hpp"

using namespace cairn;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string text = format::seal_json(std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
  switch (data[0] % 3) {
    case 0: (void)format::decode_manifest(text, "fuzz"); break;
    case 1: (void)format::decode_part(text, "fuzz"); break;
    default: (void)format::decode_run_info(text, "fuzz"); break;
  }
  return 0;
}
