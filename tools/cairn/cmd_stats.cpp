// cairn stats: a run's checkpoint metrics from the catalog, in the OpenMetrics
// text format the application's textfiles use (docs/design/metrics.md), or JSON.
#include <cstdio>

#include "commands.hpp"
#include "history/catalog.hpp"
#include "history/metrics.hpp"
#include "output.hpp"
#include "store_scan.hpp"

namespace cairn::cli {

int cmd_stats(const stats_options& o) {
  if (status st = check_store(o.store); !st) {
    print_error(st);
    return exit_code_for(st);
  }
  auto cat = history::catalog::open(o.store);
  if (!cat) {
    print_error(cat.error());
    return kExitFailure;
  }
  auto m = metrics::from_catalog(**cat, o.run);
  if (!m) {
    print_error(m.error());
    return exit_code_for(m.error());
  }
  const std::string text = o.json ? metrics::to_json(*m) : metrics::to_openmetrics(*m);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return kExitOk;
}

}  // namespace cairn::cli
