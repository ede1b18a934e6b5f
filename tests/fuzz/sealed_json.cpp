// Fuzz target: the JSON documents of a store: its sealed files (MANIFEST with
// its container index, part records, RUN), re-sealed, and the state region of
// a cairn.pytorch version (unsealed: its shard region's checksum covers it).
// The first byte picks the decoder.
#include "format/manifest.hpp"
#include "format/run_info.hpp"
#include "format/torch_state.hpp"
#include "fuzz_support.hpp"

using namespace cairn;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 4 == 3) {
    (void)format::torch_state_keys(body, "fuzz");
    return 0;
  }
  const std::string text = format::seal_json(body);
  switch (data[0] % 4) {
    case 0: (void)format::decode_manifest(text, "fuzz"); break;
    case 1: (void)format::decode_part(text, "fuzz"); break;
    default: (void)format::decode_run_info(text, "fuzz"); break;
  }
  return 0;
}
