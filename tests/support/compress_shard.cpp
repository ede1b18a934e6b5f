// cairn_compress_shard: rewrites shard files compressed (format 3), as a
// checkpoint agent writes them, so that tests of readers without an agent
// (the Python package, the CLI) see compressed shards. Not installed.
//
//   cairn_compress_shard [--level L] SHARD...
//
// Exit status: 0 done; 1 a shard could not be read or rewritten; 2 usage.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "test_store.hpp"

int main(int argc, char** argv) {
  int level = 1;
  int first = 1;
  if (argc > 2 && std::string(argv[1]) == "--level") {
    level = std::atoi(argv[2]);
    first = 3;
  }
  if (first >= argc) {
    std::fprintf(stderr, "usage: cairn_compress_shard [--level L] SHARD...\n");
    return 2;
  }
  for (int i = first; i < argc; ++i) {
    cairn::status st = cairn::test::compress_shard_file(argv[i], level);
    if (!st) {
      std::fprintf(stderr, "cairn_compress_shard: %s\n", st.to_string().c_str());
      return 1;
    }
  }
  return 0;
}
