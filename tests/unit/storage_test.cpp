#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>

#include "storage/geometry.hpp"
#include "storage/storage_env.hpp"

namespace cairn::storage {
namespace {

class storage_test : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cairn-storage-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { ASSERT_TRUE(env()->remove_tree(dir_)); }
  storage_env* env() { return storage_env::posix(); }
  std::string dir_;
};

TEST_F(storage_test, write_atomic_replaces_and_reads_back) {
  std::string p = join(dir_, "a/b/file");
  ASSERT_TRUE(env()->make_dirs(dirname_of(p)));
  ASSERT_TRUE(env()->write_atomic(p, "first", true));
  ASSERT_TRUE(env()->write_atomic(p, "second", true));
  auto got = env()->read_all(p);
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, "second");
  EXPECT_FALSE(env()->exists(p + ".tmp"));
}

TEST_F(storage_test, rate_limited_env_paces_writes_and_keeps_the_data) {
  // 24 MiB at 48 MiB/s: three 8 MiB chunks, started at 0, 1/6 and 1/3 s.
  auto limited = make_rate_limited_env(env(), 48ull << 20);
  std::string data(24u << 20, '\0');
  for (size_t i = 0; i < data.size(); i += 4096) data[i] = static_cast<char>(i >> 12);
  std::string p = join(dir_, "paced");
  auto t0 = std::chrono::steady_clock::now();
  auto f = limited->create(p, false);
  ASSERT_TRUE(f);
  ASSERT_TRUE((*f)->write_at(0, data.data(), data.size()));
  ASSERT_TRUE((*f)->close());
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(s, 0.33);  // never faster than the cap (a lower bound holds under any load)
  auto back = env()->read_all(p);
  ASSERT_TRUE(back);
  EXPECT_TRUE(*back == data);
}

TEST_F(storage_test, direct_write_of_aligned_data_is_readable) {
  std::string p = join(dir_, "direct");
  void* buf = nullptr;
  ASSERT_EQ(posix_memalign(&buf, kDirectAlign, 3 * kDirectAlign), 0);
  for (size_t i = 0; i < 3 * kDirectAlign; ++i) static_cast<char*>(buf)[i] = static_cast<char>(i);
  auto f = env()->create(p, true);
  ASSERT_TRUE(f);
  ASSERT_TRUE((*f)->write_at(0, buf, 3 * kDirectAlign));
  ASSERT_TRUE((*f)->sync());
  ASSERT_TRUE((*f)->close());
  auto r = env()->open_read(p);
  ASSERT_TRUE(r);
  EXPECT_EQ((*r)->size(), 3 * kDirectAlign);
  std::string back(3 * kDirectAlign, '\0');
  ASSERT_TRUE((*r)->read_at(0, back.data(), back.size()));
  EXPECT_EQ(0, memcmp(back.data(), buf, back.size()));
  free(buf);
}

// Large page-aligned reads go around the page cache (O_DIRECT where the file
// system allows it); every shape of read returns the same bytes, including
// bytes still dirty in the page cache and a file whose size is not aligned.
TEST_F(storage_test, large_aligned_reads_return_the_same_bytes) {
  std::string p = join(dir_, "big");
  std::string data((4u << 20) + 100, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 131) >> 7);
  ASSERT_TRUE(env()->write_atomic(p, data, false));  // not synced: dirty pages
  auto f = env()->open_read(p);
  ASSERT_TRUE(f);
  auto buf = static_cast<char*>(std::aligned_alloc(4096, 4u << 20));
  ASSERT_TRUE((*f)->read_at(0, buf, 4u << 20));  // aligned: direct where possible
  EXPECT_EQ(std::string(buf, 4u << 20), data.substr(0, 4u << 20));
  ASSERT_TRUE((*f)->read_at(4096, buf, 2u << 20));
  EXPECT_EQ(std::string(buf, 2u << 20), data.substr(4096, 2u << 20));
  ASSERT_TRUE((*f)->read_at(3, buf + 5, (2u << 20) + 1));  // unaligned: buffered
  EXPECT_EQ(std::string(buf + 5, (2u << 20) + 1), data.substr(3, (2u << 20) + 1));
  status beyond = (*f)->read_at(1u << 20, buf, 4u << 20);  // past the end: a clear error
  EXPECT_EQ(beyond.code(), errc::corruption);
  std::free(buf);
}

TEST_F(storage_test, short_read_is_corruption_and_missing_is_not_found) {
  ASSERT_TRUE(env()->write_atomic(join(dir_, "small"), "abc", false));
  auto r = env()->open_read(join(dir_, "small"));
  ASSERT_TRUE(r);
  char buf[10];
  EXPECT_EQ((*r)->read_at(0, buf, 10).code(), errc::corruption);
  EXPECT_EQ(env()->open_read(join(dir_, "nope")).error().code(), errc::not_found);
  EXPECT_EQ(env()->list(join(dir_, "nope")).error().code(), errc::not_found);
}

TEST_F(storage_test, make_dirs_over_a_file_fails_clearly) {
  ASSERT_TRUE(env()->write_atomic(join(dir_, "f"), "x", false));
  status st = env()->make_dirs(join(dir_, "f"));
  EXPECT_FALSE(st);
}

TEST_F(storage_test, fault_env_fails_after_n_matching_writes_and_keeps_old_file) {
  fault_spec spec;
  spec.prefix = join(dir_, "faulty");
  spec.kind = "write";
  spec.err = ENOSPC;
  spec.after = 1;
  auto fe = make_fault_env(env(), spec);
  ASSERT_TRUE(fe->make_dirs(spec.prefix));
  std::string p = join(spec.prefix, "m");
  ASSERT_TRUE(fe->write_atomic(p, "committed", true));  // first write passes
  status st = fe->write_atomic(p, "new", true);           // second is injected
  EXPECT_EQ(st.code(), errc::no_space);
  EXPECT_EQ(*fe->read_all(p), "committed");
  EXPECT_FALSE(fe->exists(p + ".tmp"));
  // Other paths are untouched.
  EXPECT_TRUE(fe->write_atomic(join(dir_, "other"), "ok", true));
}

TEST_F(storage_test, fault_env_path_part_selects_files) {
  fault_spec spec;
  spec.prefix = dir_;
  spec.path_part = "/v2/";
  spec.kind = "create";
  auto fe = make_fault_env(env(), spec);
  ASSERT_TRUE(fe->make_dirs(join(dir_, "v1")));
  ASSERT_TRUE(fe->make_dirs(join(dir_, "v2")));
  EXPECT_TRUE(fe->write_atomic(join(dir_, "v1/x"), "a", false));
  EXPECT_EQ(fe->write_atomic(join(dir_, "v2/x"), "a", false).code(), errc::io_error);
}

TEST_F(storage_test, geometry_of_a_local_directory_and_its_errors) {
  auto g = detect_geometry(dir_);
  ASSERT_TRUE(g) << g.error().to_string();
  EXPECT_FALSE(g->fs.empty());
  EXPECT_GE(g->stripe_unit, 512u);
  EXPECT_EQ(g->stripe_count, 1u);
  EXPECT_EQ(g->source, "st_blksize");
  auto missing = detect_geometry(dir_ + "/missing");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), errc::not_found);
  // Only CephFS layouts can be set; elsewhere the error names the file system.
  status st = set_dir_layout(dir_, 1 << 20, 2, 4 << 20);
  EXPECT_EQ(st.code(), errc::not_supported) << st.to_string();
  EXPECT_NE(st.message().find(g->fs), std::string::npos) << st.message();
}

// The fault_inject test hook, parsed in one place (the client only acts on it).
TEST(fault_plan, parses_levels_and_refuses_what_cannot_run) {
  auto p = parse_fault_plan("level=local,action=kill,kind=write,after=2,rank=1,version=7,file=shard.000001");
  ASSERT_TRUE(p) << p.error().to_string();
  EXPECT_EQ(p->level, "local");
  EXPECT_EQ(p->rank, 1);
  EXPECT_EQ(p->version, 7);
  EXPECT_EQ(p->spec.action, "kill");
  EXPECT_EQ(p->spec.kind, "write");
  EXPECT_EQ(p->spec.after, 2);
  EXPECT_EQ(p->spec.path_part, "/v000000000007/shard.000001");
  auto t = parse_fault_plan("level=transfer,action=kill,version=3,role=leader");
  ASSERT_TRUE(t) << t.error().to_string();
  EXPECT_EQ(t->role, "leader");
  EXPECT_EQ(parse_fault_plan("action=error,errno=28")->spec.err, 28);  // persistent by default
  for (const char* bad : {"level=capture,action=kill", "level=capture,action=error,version=1", "level=transfer,action=kill,version=1",
                          "level=nowhere,action=kill", "action=explode", "file=x", "errno=x", "bogus=1", "level"}) {
    auto r = parse_fault_plan(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code(), errc::invalid_argument) << bad;
    EXPECT_NE(r.error().message().find("fault_inject"), std::string::npos) << r.error().to_string();
  }
}

}  // namespace
}  // namespace cairn::storage
