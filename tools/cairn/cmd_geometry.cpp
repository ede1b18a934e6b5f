// cairn geometry: the stripe geometry of a directory (storage/geometry.hpp).
#include <cstdio>

#include "commands.hpp"
#include "output.hpp"
#include "storage/geometry.hpp"
#include "store_scan.hpp"

namespace cairn::cli {

int cmd_geometry(const geometry_options& o) {
  if (o.stripe_unit || o.stripe_count || o.object_size) {
    if (status st = storage::set_dir_layout(o.dir, o.stripe_unit, o.stripe_count, o.object_size); !st) {
      print_error(st);
      return exit_code_for(st);
    }
  }
  auto g = storage::detect_geometry(o.dir);
  if (!g) {
    print_error(g.error());
    return exit_code_for(g.error());
  }
  if (o.json) {
    print_json({{"dir", o.dir},
                {"fs", g->fs},
                {"stripe_unit", g->stripe_unit},
                {"stripe_count", g->stripe_count},
                {"object_size", g->object_size},
                {"pool", g->pool},
                {"source", g->source}});
  } else {
    std::printf("%s: %s, stripe unit %llu bytes, stripe count %u", o.dir.c_str(), g->fs.c_str(),
                static_cast<unsigned long long>(g->stripe_unit), g->stripe_count);
    if (g->object_size) std::printf(", object size %llu bytes", static_cast<unsigned long long>(g->object_size));
    if (!g->pool.empty()) std::printf(", pool %s", g->pool.c_str());
    std::printf(" (from %s)\n", g->source.c_str());
  }
  return kExitOk;
}

}  // namespace cairn::cli
