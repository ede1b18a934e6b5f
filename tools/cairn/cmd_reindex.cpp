// cairn reindex: rebuilds the catalog from the manifests.
#include <cstdio>

#include "commands.hpp"
#include "format/layout.hpp"
#include "history/catalog.hpp"
#include "output.hpp"
#include "store_scan.hpp"

namespace cairn::cli {

int cmd_reindex(const reindex_options& o) {
  if (status st = check_store(o.store); !st) {
    print_error(st);
    return exit_code_for(st);
  }
  auto cat = history::catalog::open(o.store);
  if (!cat && cat.error().code() == errc::corruption) {
    // The catalog is only an index: a damaged one is replaced, not repaired.
    print_warning(cat.error().message() + "; recreating it");
    storage::storage_env* env = storage::storage_env::posix();
    const std::string path = storage::join(o.store, format::kCatalogName);
    for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
      if (status st = env->remove_file(path + suffix); !st) {
        print_error(st);
        return kExitFailure;
      }
    }
    cat = history::catalog::open(o.store);
  }
  if (!cat) {
    print_error(cat.error());
    return exit_code_for(cat.error()) == kExitUsage ? kExitUsage : kExitFailure;
  }
  history::rebuild_stats stats;
  auto n = (*cat)->rebuild(storage::storage_env::posix(), &stats);
  if (!n) {
    print_error(n.error());
    return kExitFailure;
  }
  if (o.json) {
    print_json({{"store", o.store},
                {"catalog", storage::join(o.store, format::kCatalogName)},
                {"indexed", stats.indexed},
                {"uncommitted", stats.uncommitted},
                {"invalid", stats.invalid},
                {"problems", stats.problems}});
  } else {
    for (auto& p : stats.problems) print_warning("skipped: " + p);
    std::printf("indexed %lld versions into %s (skipped %lld uncommitted, %lld invalid)\n",
                static_cast<long long>(stats.indexed), storage::join(o.store, format::kCatalogName).c_str(),
                static_cast<long long>(stats.uncommitted), static_cast<long long>(stats.invalid));
  }
  return kExitOk;
}

}  // namespace cairn::cli
