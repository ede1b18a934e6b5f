// Fuzz target: the agents control plane (agents/wire.cpp, protocol.cpp).
// The bytes are decoded as a frame as they come (the header checks), then
// sealed as a frame under a known key so that the payload's parsers are
// reached: the JSON depth check and every typed message parser.
#include "agents/protocol.hpp"
#include "agents/wire.hpp"
#include "fuzz_support.hpp"

using namespace cairn;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const std::string key(32, 'k');
  (void)agents::decode_frame(in, key, agents::kDefaultMaxPayload);
  const std::string sealed = agents::encode_frame(key, agents::ctl_type::hello, 0, in);
  auto d = agents::decode_frame(sealed, key, agents::kDefaultMaxPayload);
  if (d.what != agents::decoded_frame::kind::frame) return 0;
  auto j = util::parse_json_object(d.payload);
  if (!j) return 0;
  (void)agents::parse_metrics(*j);
  (void)agents::parse_hints(*j);
  (void)agents::parse_node_update(*j);
  (void)agents::parse_reports(j->contains("agents") ? &(*j)["agents"] : nullptr);
  return 0;
}
