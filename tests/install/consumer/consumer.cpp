// The installed C++ API: RAII handle, status values.
#include <cairn/cairn.hpp>

#include <cstdio>
#include <vector>

int main() {
  std::vector<int64_t> v(4096);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i * i);
  const auto saved = v;
  auto c = cairn::client::create();
  if (!c) { std::fprintf(stderr, "%s\n", c.error().to_string().c_str()); return 1; }
  if (auto st = c->protect("v", std::span<int64_t>(v)); !st) { std::fprintf(stderr, "%s\n", st.to_string().c_str()); return 1; }
  if (auto st = c->checkpoint("cpp", 7); !st) { std::fprintf(stderr, "%s\n", st.to_string().c_str()); return 1; }
  if (auto st = c->wait("cpp", 7, CAIRN_LEVEL_PERSISTENT); !st) { std::fprintf(stderr, "%s\n", st.to_string().c_str()); return 1; }
  std::fill(v.begin(), v.end(), 0);
  auto ver = c->restart_test("cpp");
  if (!ver || *ver != 7) { std::fprintf(stderr, "restart_test failed\n"); return 1; }
  if (auto st = c->restart("cpp", *ver); !st) { std::fprintf(stderr, "%s\n", st.to_string().c_str()); return 1; }
  if (auto st = c->finalize(true); !st) { std::fprintf(stderr, "%s\n", st.to_string().c_str()); return 1; }
  if (v != saved) { std::fprintf(stderr, "consumer_cpp: restored data differs\n"); return 1; }
  std::printf("consumer_cpp: ok\n");
  return 0;
}
