// Fuzz target: the agents controller's journal (agents/journal.cpp), every
// record re-sealed, replayed into a controller state (its record checks).
#include "agents/controller_state.hpp"
#include "agents/journal.hpp"
#include "fuzz_support.hpp"

using namespace cairn;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string image(reinterpret_cast<const char*>(data), size);
  for (size_t off = agents::kJournalHeaderSize; off + agents::kJournalRecordHeader <= image.size();) {
    const uint32_t len = fuzz::get_u32(image, off);
    const size_t body = off + agents::kJournalRecordHeader;
    if (len > image.size() - body) break;
    fuzz::put_u64(&image, off + 4, util::xxh3(image.data() + body, len));
    off = body + len;
  }
  agents::controller_state state({}, [](const nlohmann::json&) { return cairn::status(); });
  agents::journal_replay stats;
  (void)agents::replay_journal(image, [&](const nlohmann::json& rec) { return state.apply(rec); }, &stats);
  return 0;
}
