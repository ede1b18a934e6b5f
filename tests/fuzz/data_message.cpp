// Fuzz target: the data-plane messages of agents, leaders and redundancy
// sets (agents/data_protocol.cpp) and the lists they carry as text.
#include "agents/data_protocol.hpp"

using namespace cairn;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  auto m = agents::decode_data_message(in);
  if (m) {
    (void)agents::decode_lent(m->text);
    (void)agents::decode_held(m->text);
    (void)agents::data_message_status(*m);
  }
  (void)agents::decode_lent(std::string(in));
  (void)agents::decode_held(std::string(in));
  return 0;
}
