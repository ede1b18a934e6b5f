// Writes the fuzz targets' seed corpora: for each target a directory of
// inputs made by cairn's own encoders (a store's shard images, MANIFESTs,
// RUN, part records, hash trees, a parity header; the agents' journal,
// control and data messages; the frames a rank sends its node daemon), in
// the form that target takes them. Usage: cairn_fuzz_seeds <dir>.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agents/data_protocol.hpp"
#include "agents/journal.hpp"
#include "agents/protocol.hpp"
#include "daemon/protocol.hpp"
#include "format/manifest.hpp"
#include "format/run_info.hpp"
#include "format/shard_io.hpp"
#include "format/tree.hpp"
#include "redundancy/parity_file.hpp"
#include "test_store.hpp"
#include "util/hash.hpp"
#include "util/hex.hpp"
#include "util/json.hpp"

using namespace cairn;
using nlohmann::json;

namespace {

std::string root;

void put(const std::string& target, int n, const std::string& bytes) {
  const std::string dir = root + "/" + target;
  mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/seed" + std::to_string(n), std::ios::binary) << bytes;
}

std::string str(const std::vector<std::byte>& v) { return std::string(reinterpret_cast<const char*>(v.data()), v.size()); }

// The body of a sealed text (what sealed_json takes after its selector byte).
std::string body(const std::string& sealed) { return sealed.substr(0, sealed.rfind("xxh3 ")); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: cairn_fuzz_seeds <dir>\n");
    return 2;
  }
  root = argv[1];
  mkdir(root.c_str(), 0755);
  const std::vector<test::region_spec> regions = {
      {"grid", 10 /* double */, 12, {3, 4}, false}, {"step", 4 /* int64 */, 1, {}, false},
      {"names", 1 /* uint8 */, 40, {}, false}, {"field", 9 /* float */, 24, {2, 3, 4}, true}};
  int n = 0;
  for (uint32_t rank : {0u, 1u}) {
    auto img = test::make_shard_image("run-a", "ckpt", 6, rank, 2, regions);
    if (!img) return 1;
    put("shard_header", n++, str(img->bytes));
    // The image's tree as the engine builds it.
    format::tree_file t = format::build_tree(img->header, img->bytes, 64, 0);
    put("tree", rank, format::encode_tree(t));
  }
  // Whole shard files as restart reads them: uncompressed, and compressed
  // (zstd frames: a region of zeros that shrinks, beside ones that do not).
  {
    std::vector<test::region_spec> more = regions;
    more.push_back({"zeros", 1 /* uint8 */, 1 << 16, {}, false});
    int s = 0;
    for (uint32_t rank : {0u, 1u}) {
      auto img = test::make_shard_image("run-a", "ckpt", 6, rank, 2, more);
      if (!img) return 1;
      for (auto& r : img->header.regions)
        if (r.name == "zeros") {
          std::fill(img->bytes.begin() + static_cast<long>(r.offset),
                    img->bytes.begin() + static_cast<long>(r.offset + r.length), std::byte{0});
          r.checksum = util::xxh3(img->bytes.data() + r.offset, r.length);
        }
      format::encode_header(img->header, img->bytes);
      put("shard_image", s++, str(img->bytes));
      auto c = format::compress_shard(img->header, img->bytes);
      if (!c) return 1;
      const auto f = c->file();
      put("shard_image", s++, std::string(reinterpret_cast<const char*>(f.data()), f.size()));
    }
  }
  // A store's MANIFEST (as written), a part record and RUN.
  test::temp_dir dir;
  test::version_spec spec;
  spec.run = "run-a";
  spec.name = "ckpt";
  spec.version = 6;
  spec.nranks = 2;
  spec.regions = regions;
  format::manifest m;
  if (!test::write_version(dir.path(), spec, &m)) return 1;
  put("sealed_json", 0, std::string(1, '\0') + body(format::encode_manifest(m)));
  format::part_record p;
  p.entry = m.shards.at(0);
  put("sealed_json", 1, std::string(1, '\1') + body(format::encode_part(p)));
  format::run_info r;
  r.run = "run-a";
  r.application = "app";
  r.tags = {{"k", "v"}};
  format::execution e;
  e.started_at = 1;
  e.ended_at = 2;
  e.nranks = 2;
  e.hosts = {"h1"};
  e.nodes = {"n1"};
  e.job = "42";
  e.executable = "/bin/app";
  r.executions.push_back(e);
  put("sealed_json", 2, std::string(1, '\2') + body(format::encode_run_info(r)));
  // A cairn.pytorch state region (docs/format/torch_state.md).
  put("sealed_json", 3,
      std::string(1, '\3') +
          R"({"format":"cairn-torch-state","format_version":1,"state":{"dict":[["model",{"dict":[["w",)"
          R"({"tensor":0,"dtype":"float32","shape":[2,3],"requires_grad":false}]],"ordered":true}],)"
          R"(["rng",{"tuple":["MT19937",{"tensor":1,"ndarray":true,"dtype":"<u4","shape":[4]},NaN]}],)"
          R"(["x",{"np_scalar":"<f8","value":-Infinity}],["l",{"list":[null,true,"s"]}]]}})");
  // A parity header of a set of three.
  redundancy::parity_header ph;
  ph.run = "run-a";
  ph.name = "ckpt";
  ph.version = 6;
  ph.nranks = 3;
  ph.geo.kind = redundancy::scheme::xor_parity;
  ph.geo.k = 3;
  ph.geo.m = 1;
  ph.set = {{0, "n0", 8192, 1}, {1, "n1", 8192, 2}, {2, "n2", 4096, 3}};
  ph.blocks = {{0, 0, 0, 4096, 7}, {1, 0, 0, 4096, 8}};
  put("parity_header", 0, redundancy::encode_parity_header(&ph));
  // The controller's journal.
  std::string jnl(agents::kJournalMagic, 8);
  jnl += std::string("\1\0\0\0\0\0\0\0", 8);
  for (const json& rec : {json{{"op", "ids"}, {"next_app", 3}, {"next_agent", 5}},
                          json{{"op", "node_add"}, {"node", "n1"}, {"address", "127.0.0.1:5000"}, {"capacity", 2}},
                          json{{"op", "app_add"}, {"app", 1}, {"name", "a"}, {"hints", json::object()}, {"target", 1},
                               {"strategy", "bandwidth"}, {"distribution", "round_robin"}, {"block_size", 2}},
                          json{{"op", "agent_add"}, {"agent", 1}, {"app", 1}, {"node", "n1"}, {"reserve", 4096}},
                          json{{"op", "app_target"}, {"app", 1}, {"target", 2}}, json{{"op", "agent_remove"}, {"agent", 1}},
                          json{{"op", "node_remove"}, {"node", "n1"}, {"reason", "lost"}}})
    jnl += agents::encode_journal_record(rec);
  put("journal", 0, jnl);
  // Control payloads (the target seals them as frames itself).
  put("control", 0, util::dump_json(agents::to_json(agents::node_metrics{})));
  put("control", 1, util::dump_json(agents::to_json(agents::app_hints{})));
  put("control", 2, util::dump_json(agents::to_json(agents::node_update{})));
  put("control", 3, util::dump_json(json{{"agents", json::array({agents::to_json(agents::agent_report{})})}}));
  // Data-plane messages.
  agents::data_message dm;
  dm.run = "run-a";
  dm.name = "ckpt";
  dm.version = 6;
  dm.length = 8192;
  dm.reply_to = "ep";
  for (auto t : {agents::data_msg::ready, agents::data_msg::held, agents::data_msg::restore, agents::data_msg::release}) {
    dm.type = t;
    put("data_message", n++, agents::encode_data_message(dm));
  }
  put("data_message", n++, agents::encode_lent({{0, 4096, 7}, {1, 8192, 9}}));
  put("data_message", n++, agents::encode_held({{6, 8192, 1}, {8, 8192, 2}}));
  // A rank's frames to its daemon, as one stream (what the target reads).
  auto frame = [](daemon::msg t, const std::string& meta, const std::string& payload = {}) {
    std::string f;
    const uint32_t len = static_cast<uint32_t>(1 + 4 + meta.size() + payload.size()), ml = static_cast<uint32_t>(meta.size());
    f.append(reinterpret_cast<const char*>(&len), 4);
    f.push_back(static_cast<char>(t));
    f.append(reinterpret_cast<const char*>(&ml), 4);
    return f + meta + payload;
  };
  const std::string hello = json{{"rank", 0}, {"nranks", 2}, {"token", std::string(64, 'a')}, {"pid", 1},
                                 {"executable", "app"}, {"config", {{"persistent", "/tmp/s"}, {"run", "r"}}}}.dump();
  const std::string start =
      json{{"redundancy", {{"scheme", "xor"}, {"k", 2}, {"m", 1}, {"members", {0, 1}}, {"nodes", {"a", "b"}},
                           {"position", 0}, {"peers", {"6162", "6364"}}, {"key", std::string(64, '7')},
                           {"record", {{"scheme", "xor"}, {"description", "x"}, {"k", 2}, {"m", 1}, {"sets", {{0, 1}}}}}}}}
          .dump();
  const std::string job = json{{"id", 1}, {"slot", 3}, {"wanted", 7}, {"captured_at", 1.5}, {"capture_s", 0.1}}.dump();
  auto img = test::make_shard_image("run-a", "ckpt", 6, 0, 2, regions);
  put("daemon_frame", 0, hello);
  put("daemon_frame", 1, start);
  put("daemon_frame", 2, job);
  put("daemon_frame", 3,
      frame(daemon::msg::hello, hello) + frame(daemon::msg::start, start) +
          frame(daemon::msg::job, job, str(img->bytes).substr(0, img->header.data_offset)) +
          frame(daemon::msg::committed, json{{"name", "ckpt"}, {"version", 6}}.dump()) +
          frame(daemon::msg::release, json{{"id", 3}}.dump()) + frame(daemon::msg::bye, ""));
  return 0;
}
