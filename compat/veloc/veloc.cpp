// VELOC client API (compat/veloc/include/veloc.h) over cairn's C API.
//
// The library keeps VELOC's notions (integer region ids in groups, one
// begin/end sequence at a time, one routed file per rank and version) and
// maps each call onto cairn_* calls; docs/design/compat.md says how and
// where the semantics differ. Only cairn.h and cairn_mpi.h are used.
#include "veloc.h"

#include <cairn_mpi.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace {

// ---- messages ----------------------------------------------------------------

int fail(const char* fn, const std::string& what) {
  std::fprintf(stderr, "VELOC (cairn): %s: %s\n", fn, what.c_str());
  std::fflush(stderr);
  return VELOC_FAILURE;
}

int fail_cairn(const char* fn, int code) {
  const char* msg = cairn_last_error();
  return fail(fn, std::string(cairn_strerror(code)) + ": " + (msg && *msg ? msg : "(no message)"));
}

// ---- configuration -----------------------------------------------------------

// VELOC's keys; the value says what becomes of each (docs/design/compat.md).
const std::set<std::string> kKnownKeys = {
    "scratch",         "persistent",  "mode",       "max_versions", "scratch_versions", "persistent_interval",
    "ec_interval",     "watchdog_interval", "failure_domain", "axl_type", "chksum", "meta", "aggregated",
    "log_prefix",      "threaded",    "daos_pool",  "daos_cont", "max_parallelism"};

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

bool parse_int(const std::string& text, long* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

bool parse_bool(const std::string& text, bool* out) {
  std::string t = lower(text);
  if (t == "true" || t == "1" || t == "yes" || t == "on") { *out = true; return true; }
  if (t == "false" || t == "0" || t == "no" || t == "off") { *out = false; return true; }
  return false;
}

// A TOML basic string.
std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      out += buf;
      continue;
    }
    out += ch;
  }
  return out + "\"";
}

// Reads a VELOC configuration file ("key = value" lines; '#' and ';' start
// comments; VELOC_<KEY> in the environment wins, as in VELOC) and writes the
// equivalent cairn TOML text to *toml. Returns false with *why set.
struct translated {
  std::string toml;     // cairn's configuration
  std::string scratch;  // VELOC's scratch directory
  bool sync = false;
};

// Longer than 120 lines for a reason: the parser of VELOC's configuration
// file and the table of its keys' translations, each key with its message.
bool translate_config(const char* path, const std::string& run, int ranks, bool is_rank0, translated* t,
                      std::string* why) {
  if (path == nullptr || *path == '\0') {
    *why = "no configuration file given (VELOC needs one with at least scratch, persistent and mode)";
    return false;
  }
  std::ifstream in(path);
  if (!in) {
    *why = std::string("cannot open configuration file '") + path + "': " + std::strerror(errno);
    return false;
  }
  std::map<std::string, std::string> kv;
  std::vector<std::string> unknown;  // warned about below, as VELOC ignores them
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    std::string t = trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    std::string where = std::string(path) + ":" + std::to_string(lineno) + ": ";
    if (t[0] == '[') {
      *why = where + "sections are not used by VELOC's client configuration; put every key at the top level";
      return false;
    }
    size_t eq = t.find('=');
    if (eq == std::string::npos) {
      *why = where + "expected 'key = value', got '" + t + "'";
      return false;
    }
    std::string key = lower(trim(t.substr(0, eq)));
    std::string value = trim(t.substr(eq + 1));
    // Inline comments (INI style: " ;" or " #").
    for (const char* mark : {" ;", " #", "\t;", "\t#"}) {
      size_t c = value.find(mark);
      if (c != std::string::npos) value = trim(value.substr(0, c));
    }
    if (!kKnownKeys.count(key)) {
      unknown.push_back(where + "unknown key '" + key + "' ignored");
      continue;
    }
    if (kv.count(key)) {
      *why = where + "key '" + key + "' given twice";
      return false;
    }
    kv[key] = value;
  }
  for (const auto& key : kKnownKeys) {
    std::string env = "VELOC_";
    for (char ch : key) env += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (const char* v = std::getenv(env.c_str()); v && *v) kv[key] = v;
  }
  auto warn = [&](const std::string& text) {
    if (is_rank0) std::fprintf(stderr, "VELOC (cairn): warning: %s\n", text.c_str());
  };
  for (const auto& u : unknown)
    warn(u + " (VELOC keys: scratch, persistent, mode, max_versions, scratch_versions, persistent_interval, "
             "ec_interval, watchdog_interval, failure_domain, axl_type, chksum, meta, aggregated, log_prefix, "
             "threaded, max_parallelism)");
  if (kv.count("max_parallelism"))
    warn("max_parallelism: cairn's engine chooses its own threads (engine_threads); the key is ignored");
  std::ostringstream out;
  for (const char* required : {"scratch", "persistent", "mode"}) {
    if (!kv.count(required) || kv[required].empty()) {
      *why = std::string(path) + ": required key '" + required + "' is missing or empty (" +
             (std::string(required) == "mode" ? "mode = sync or mode = async"
                                              : std::string(required) + " = <directory>") +
             ")";
      return false;
    }
  }
  if (kv.count("daos_pool") || kv.count("daos_cont")) {
    *why = std::string(path) + ": DAOS (daos_pool, daos_cont) is not supported by the cairn drop-in; "
                               "use persistent = <directory>";
    return false;
  }
  out << "scratch = " << toml_string(kv["scratch"]) << "\n";
  out << "persistent = " << toml_string(kv["persistent"]) << "\n";
  std::string mode = lower(kv["mode"]);
  if (mode != "sync" && mode != "async") {
    *why = std::string(path) + ": mode = '" + kv["mode"] + "' is invalid; it must be sync or async";
    return false;
  }
  out << "mode = " << toml_string(mode == "sync" ? "sync" : "thread") << "\n";
  t->sync = mode == "sync";
  t->scratch = kv["scratch"];
  auto versions = [&](const char* key, const char* cairn_key) -> bool {
    if (!kv.count(key)) {
      out << cairn_key << " = 0\n";  // VELOC's default: keep all
      return true;
    }
    long n = 0;
    if (!parse_int(kv[key], &n) || n < 0 || n > INT_MAX) {
      *why = std::string(path) + ": " + key + " = '" + kv[key] + "' must be an integer >= 0 (0 = keep all)";
      return false;
    }
    out << cairn_key << " = " << n << "\n";
    return true;
  };
  if (!versions("max_versions", "keep_persistent") || !versions("scratch_versions", "keep_local")) return false;
  // VELOC keeps scratch_versions in scratch after the application ends (its
  // tests restart from scratch when the persistent copy is damaged).
  out << "keep_local_after_finalize = true\n";
  if (kv.count("persistent_interval")) {
    long n = 0;
    if (!parse_int(kv["persistent_interval"], &n)) {
      *why = std::string(path) + ": persistent_interval = '" + kv["persistent_interval"] + "' must be an integer";
      return false;
    }
    if (n < 0) {
      // VELOC's -1: checkpoints stay in scratch, none is flushed.
      out << "persistent_interval = " << (1L << 30) << "\n";
    } else if (n > 0) {
      // VELOC flushes at most one checkpoint per n seconds; cairn flushes
      // every one in the background, which loses nothing that VELOC keeps.
      warn("persistent_interval = " + std::to_string(n) +
           " s: the cairn drop-in flushes every checkpoint to the persistent level (in the background), not at "
           "most one per " + std::to_string(n) + " s");
    }
  }
  for (const char* key : {"ec_interval", "watchdog_interval"}) {
    long n = 0;
    if (kv.count(key) && !parse_int(kv[key], &n)) {
      *why = std::string(path) + ": " + key + " = '" + kv[key] + "' must be an integer";
      return false;
    }
  }
  // Erasure coding: VELOC's default (0) codes every checkpoint of a parallel
  // job, -1 none. cairn's xor sets span failure domains (nodes); a job on one
  // node, or one that cannot form the sets, runs without (said once at init).
  long ec = 0;
  if (kv.count("ec_interval")) parse_int(kv["ec_interval"], &ec);
  if (ec >= 0 && ranks > 1) {
    out << "redundancy = \"xor\"\nredundancy_required = false\n";
    if (ec > 0)
      warn("ec_interval = " + std::to_string(ec) +
           " s: the cairn drop-in protects every checkpoint with XOR parity on other nodes, not at most one per " +
           std::to_string(ec) + " s");
  }
  for (const char* key : {"chksum", "aggregated", "threaded"}) {
    bool b = false;
    if (kv.count(key) && !parse_bool(kv[key], &b)) {
      *why = std::string(path) + ": " + key + " = '" + kv[key] + "' must be true or false";
      return false;
    }
  }
  if (kv.count("aggregated")) {
    bool b = false;
    parse_bool(kv["aggregated"], &b);
    out << "persistent_layout = " << toml_string(b ? "aggregated" : "file_per_process") << "\n";
  }
  if (kv.count("failure_domain") && !kv["failure_domain"].empty())
    out << "node_id = " << toml_string(kv["failure_domain"]) << "\n";
  if (kv.count("axl_type"))
    warn("axl_type: cairn flushes with its own writer (O_DIRECT, fsync, atomic commit); the key is ignored");
  if (!run.empty()) out << "run = " << toml_string(run) << "\n";
  // VELOC users expect the next job to restart: the default run names the
  // program and its directory, not the job (docs/design/compat.md).
  out << "run_scope = \"program\"\n";
  t->toml = out.str();
  return true;
}

// Writes the TOML text to a private temporary file; returns its path or "".
std::string write_temp(const std::string& text, std::string* why) {
  const char* dir = std::getenv("TMPDIR");
  std::string tmpl = std::string(dir && *dir ? dir : "/tmp") + "/veloc-cairn-XXXXXX";
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  int fd = mkstemp(name.data());
  if (fd < 0) {
    *why = "cannot create a temporary file in " + tmpl + ": " + std::strerror(errno);
    return "";
  }
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *why = std::string("cannot write ") + name.data() + ": " + std::strerror(errno);
      ::close(fd);
      ::unlink(name.data());
      return "";
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return name.data();
}

// ---- state -------------------------------------------------------------------

struct mem_region {
  void* ptr = nullptr;
  size_t bytes = 0;
  bool operator==(const mem_region& o) const { return ptr == o.ptr && bytes == o.bytes; }
};

enum class phase { none, checkpoint, restart };

struct veloc_state {
  cairn_t* c = nullptr;
  MPI_Comm comm = MPI_COMM_NULL;  // our duplicate, for the agreements of the drop-in
  int rank = 0;
  bool sync = false;
  std::string scratch;
  std::map<std::string, std::map<int, mem_region>> groups;  // "" = VELOC_Mem_* regions
  std::map<std::string, mem_region> in_cairn;                // what cairn has protected now

  phase ph = phase::none;
  std::string name;
  int version = 0;
  // Checkpoint sequence.
  bool mem_requested = false;
  std::map<int, mem_region> mem_selection;
  bool file_routed = false;
  std::string route_path;  // where this rank writes its file before it is handed to cairn
  // This process's own directory for routed files: two jobs (or two
  // executions) on one node never write, or take, each other's.
  std::string route_dir;

  bool have_last = false;  // the last version taken, for _wait and _finished
  std::string last_name;
  int64_t last_version = 0;
};

veloc_state* g = nullptr;

std::string region_name(int id) { return "veloc." + std::to_string(id); }

bool valid_name(const char* name) {
  if (name == nullptr || *name == '\0' || std::strlen(name) > 128) return false;
  for (const char* p = name; *p; ++p)
    if (!std::isalnum(static_cast<unsigned char>(*p)) && *p != '_' && *p != '.') return false;
  return true;
}

std::map<int, mem_region>& current_group(const std::string& name) {
  auto it = g->groups.find(name);
  if (it != g->groups.end() && !it->second.empty()) return it->second;
  return g->groups[""];
}

// Makes cairn's protected set exactly `want` (id -> region).
int sync_protected(const char* fn, const std::map<int, mem_region>& want) {
  std::map<std::string, mem_region> target;
  for (const auto& [id, r] : want) target[region_name(id)] = r;
  for (auto it = g->in_cairn.begin(); it != g->in_cairn.end();) {
    if (!target.count(it->first)) {
      int rc = cairn_unprotect(g->c, it->first.c_str());
      if (rc != CAIRN_OK) return fail_cairn(fn, rc);
      it = g->in_cairn.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [rn, r] : target) {
    auto cur = g->in_cairn.find(rn);
    if (cur != g->in_cairn.end() && cur->second == r) continue;
    int rc = cairn_protect(g->c, rn.c_str(), r.ptr, r.bytes, CAIRN_BYTE);
    if (rc != CAIRN_OK) return fail_cairn(fn, rc);
    g->in_cairn[rn] = r;
  }
  return VELOC_SUCCESS;
}

// Under MPI: every rank's flag combined (all must be true). Serial: the flag.
bool all_ranks(bool mine) {
  if (g->comm == MPI_COMM_NULL) return mine;
  int v = mine ? 1 : 0, out = 0;
  MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MIN, g->comm);
  return out == 1;
}

std::string routed_base() {
  return g->name + "-" + std::to_string(g->rank) + "-" + std::to_string(g->version) + ".dat";
}

bool make_dirs(const std::string& path) {
  std::string cur;
  std::stringstream ss(path);
  std::string part;
  if (!path.empty() && path[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  return true;
}

// Moves a file, copying when source and target are on different file systems.
bool move_file(const std::string& from, const std::string& to, std::string* why) {
  if (std::rename(from.c_str(), to.c_str()) == 0) return true;
  if (errno != EXDEV) {
    *why = "cannot move " + from + " to " + to + ": " + std::strerror(errno);
    return false;
  }
  std::ifstream in(from, std::ios::binary);
  std::ofstream out(to, std::ios::binary | std::ios::trunc);
  out << in.rdbuf();
  out.flush();
  if (!in || !out) {
    *why = "cannot copy " + from + " to " + to;
    return false;
  }
  std::remove(from.c_str());
  return true;
}

int init_common(const char* fn, MPI_Comm comm, bool mpi, unsigned id, const char* cfg_file) {
  if (g != nullptr) return fail(fn, "VELOC is already initialized (call VELOC_Finalize first)");
  int rank = 0, ranks = 1;
  if (mpi) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) return fail(fn, "MPI is not initialized: call MPI_Init before VELOC_Init");
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &ranks);
  }
  std::string run;
  if (!mpi) {
    // Independent processes: one run per id (the executable's name, as cairn's default, and the id).
    std::string exe = program_invocation_short_name;
    run = exe + ".id" + std::to_string(id);
  }
  translated cfg;
  std::string why;
  bool ok = translate_config(cfg_file, run, ranks, rank == 0, &cfg, &why);
  // Every rank reads the same file; agree so that all fail together.
  if (mpi) {
    int v = ok ? 1 : 0, out = 0;
    MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MIN, comm);
    if (out == 0) return fail(fn, ok ? "another rank could not read the configuration (see its message)" : why);
  } else if (!ok) {
    return fail(fn, why);
  }
  std::string path = write_temp(cfg.toml, &why);
  ok = !path.empty();
  if (mpi) {
    int v = ok ? 1 : 0, out = 0;
    MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MIN, comm);
    if (out == 0) {
      if (ok) ::unlink(path.c_str());
      return fail(fn, ok ? "another rank could not write its temporary configuration" : why);
    }
  } else if (!ok) {
    return fail(fn, why);
  }
  cairn_t* c = nullptr;
  int rc = mpi ? cairn_init_mpi(comm, path.c_str(), &c) : cairn_init(path.c_str(), &c);
  ::unlink(path.c_str());
  if (rc != CAIRN_OK) return fail_cairn(fn, rc);
  auto* st = new veloc_state;
  st->c = c;
  st->rank = mpi ? rank : static_cast<int>(id);
  if (mpi) MPI_Comm_dup(comm, &st->comm);
  st->sync = cfg.sync;
  // The routed files' directory: cairn's scratch (CAIRN_SCRATCH overrides the file).
  const char* env_scratch = std::getenv("CAIRN_SCRATCH");
  st->scratch = env_scratch && *env_scratch ? env_scratch : cfg.scratch;
  g = st;
  return VELOC_SUCCESS;
}

#define VELOC_NEED_INIT(fn) \
  if (g == nullptr) return fail(fn, "VELOC is not initialized (call VELOC_Init first)")

int protect_in(const char* fn, const std::string& group, int id, void* ptr, size_t count, size_t base_size) {
  VELOC_NEED_INIT(fn);
  if (ptr == nullptr && count * base_size > 0) return fail(fn, "region " + std::to_string(id) + ": ptr is NULL");
  if (base_size != 0 && count > SIZE_MAX / base_size)
    return fail(fn, "region " + std::to_string(id) + ": count * base_size overflows");
  g->groups[group][id] = mem_region{ptr, count * base_size};
  return VELOC_SUCCESS;
}

int unprotect_in(const char* fn, const std::string& group, int id) {
  VELOC_NEED_INIT(fn);
  auto it = g->groups.find(group);
  if (it == g->groups.end() || it->second.erase(id) == 0)
    return fail(fn, "region " + std::to_string(id) + " is not protected");
  return VELOC_SUCCESS;
}

// The regions of `all` chosen by a VELOC_*_SOME / _REST selection.
std::map<int, mem_region> select(const std::map<int, mem_region>& all, int mode, const int* ids, int id_count) {
  std::set<int> chosen(ids, ids + (ids && id_count > 0 ? id_count : 0));
  std::map<int, mem_region> out;
  for (const auto& [id, r] : all) {
    bool in = chosen.count(id) > 0;
    if (mode == VELOC_CKPT_ALL || (mode == VELOC_CKPT_SOME && in) || (mode == VELOC_CKPT_REST && !in)) out[id] = r;
  }
  return out;
}

void end_sequence() {
  g->ph = phase::none;
  g->mem_requested = false;
  g->mem_selection.clear();
  g->file_routed = false;
  g->route_path.clear();
}

}  // namespace

extern "C" {

int VELOC_Init(MPI_Comm comm, const char* cfg_file) { return init_common(__func__, comm, true, 0, cfg_file); }

int VELOC_Init_single(unsigned int id, const char* cfg_file) {
  return init_common(__func__, MPI_COMM_NULL, false, id, cfg_file);
}

int VELOC_Finalize(int drain) {
  VELOC_NEED_INIT(__func__);
  int ret = VELOC_SUCCESS;
  if (g->ph != phase::none) {
    std::fprintf(stderr, "VELOC (cairn): VELOC_Finalize: a checkpoint or restart sequence was left open; dropped\n");
    if (g->ph == phase::restart) (void)cairn_restart_end(g->c, 0);
    if (!g->route_path.empty()) std::remove(g->route_path.c_str());
  }
  int rc = cairn_finalize(&g->c, drain ? 1 : 0);
  if (rc != CAIRN_OK) ret = fail_cairn(__func__, rc);
  if (!g->route_dir.empty()) (void)::rmdir(g->route_dir.c_str());
  if (g->comm != MPI_COMM_NULL) MPI_Comm_free(&g->comm);
  delete g;
  g = nullptr;
  return ret;
}

int VELOC_Mem_protect(int id, void* ptr, size_t count, size_t base_size) {
  return protect_in(__func__, "", id, ptr, count, base_size);
}
int VELOC_Region_protect(int id, void* ptr, size_t count, size_t base_size, const char* name) {
  return protect_in(__func__, name ? name : "", id, ptr, count, base_size);
}
int VELOC_Mem_unprotect(int id) { return unprotect_in(__func__, "", id); }
int VELOC_Region_unprotect(int id, const char* name) { return unprotect_in(__func__, name ? name : "", id); }
int VELOC_Mem_clear(void) {
  VELOC_NEED_INIT(__func__);
  g->groups[""].clear();
  return VELOC_SUCCESS;
}
int VELOC_Region_clear(const char* name) {
  VELOC_NEED_INIT(__func__);
  g->groups[name ? name : ""].clear();
  return VELOC_SUCCESS;
}

int VELOC_Checkpoint_begin(const char* name, int version) {
  VELOC_NEED_INIT(__func__);
  if (g->ph != phase::none)
    return fail(__func__, "a checkpoint or restart sequence is already open (call the matching _end first)");
  if (!valid_name(name) || version < 0)
    return fail(__func__, std::string("checkpoint name '") + (name ? name : "(null)") +
                              "' or version " + std::to_string(version) +
                              " invalid: the name is 1 to 128 of [a-zA-Z0-9_.], the version >= 0");
  g->ph = phase::checkpoint;
  g->name = name;
  g->version = version;
  return VELOC_SUCCESS;
}

int VELOC_Checkpoint_selective(int mode, int* ids, int id_count) {
  VELOC_NEED_INIT(__func__);
  if (g->ph != phase::checkpoint) return fail(__func__, "call VELOC_Checkpoint_begin first");
  if (mode != VELOC_CKPT_ALL && mode != VELOC_CKPT_SOME && mode != VELOC_CKPT_REST)
    return fail(__func__, "mode must be VELOC_CKPT_ALL, VELOC_CKPT_SOME or VELOC_CKPT_REST");
  if (g->file_routed)
    return fail(__func__, "memory regions and a routed file in one checkpoint are not supported "
                          "(VELOC writes both to the same file); use two checkpoint names");
  auto sel = select(current_group(g->name), mode, ids, id_count);
  if (sel.empty())
    return fail(__func__, "empty selection of memory regions: protect regions with VELOC_Mem_protect first");
  for (auto& [id, r] : sel) g->mem_selection[id] = r;
  g->mem_requested = true;
  return VELOC_SUCCESS;
}

int VELOC_Checkpoint_mem(void) { return VELOC_Checkpoint_selective(VELOC_CKPT_ALL, nullptr, 0); }

int VELOC_Route_file(const char* original, char* routed) {
  VELOC_NEED_INIT(__func__);
  if (original == nullptr || routed == nullptr) return fail(__func__, "original and routed must not be NULL");
  routed[0] = '\0';
  std::string path;
  if (g->ph == phase::checkpoint) {
    if (g->mem_requested)
      return fail(__func__, "memory regions and a routed file in one checkpoint are not supported "
                            "(VELOC writes both to the same file); use two checkpoint names");
    if (g->route_dir.empty()) {
      std::random_device rd;
      char tag[32];
      std::snprintf(tag, sizeof tag, "%d-%08x", static_cast<int>(::getpid()), rd());
      g->route_dir = g->scratch + "/veloc-route/" + tag;
    }
    const std::string& dir = g->route_dir;
    if (!make_dirs(dir)) return fail(__func__, "cannot create " + dir + ": " + std::strerror(errno));
    path = dir + "/" + routed_base();
    g->file_routed = true;
    g->route_path = path;
  } else if (g->ph == phase::restart) {
    char buf[4096];
    int rc = cairn_route_file(g->c, routed_base().c_str(), buf, sizeof buf);
    if (rc != CAIRN_OK) return fail_cairn(__func__, rc);
    path = buf;
  } else {
    return fail(__func__, "outside a checkpoint or restart sequence (call VELOC_Checkpoint_begin or "
                          "VELOC_Restart_begin first)");
  }
  if (path.size() + 1 > VELOC_MAX_NAME)
    return fail(__func__, "routed path '" + path + "' is longer than VELOC_MAX_NAME");
  std::memcpy(routed, path.c_str(), path.size() + 1);
  return VELOC_SUCCESS;
}

int VELOC_Checkpoint_end(int success) {
  VELOC_NEED_INIT(__func__);
  if (g->ph != phase::checkpoint) return fail(__func__, "call VELOC_Checkpoint_begin first");
  const bool file = g->file_routed;
  const bool mem = g->mem_requested;
  // One agreement: every rank succeeded (its regions protected in cairn),
  // and all took the same kind of checkpoint. Each collective costs a
  // scheduling round on a busy node, so the protection's outcome rides on it.
  bool ok = success != 0 && (file || mem);
  bool protected_here = true;
  if (ok && mem && !file) protected_here = ok = sync_protected(__func__, g->mem_selection) == VELOC_SUCCESS;
  int flags[3] = {ok ? 1 : 0, file ? 1 : 0, file ? 0 : 1};
  if (g->comm != MPI_COMM_NULL) MPI_Allreduce(MPI_IN_PLACE, flags, 3, MPI_INT, MPI_MIN, g->comm);
  const std::string route = g->route_path;
  const std::string name = g->name;
  const int version = g->version;
  end_sequence();
  if (flags[0] == 0 || (flags[1] == 0 && flags[2] == 0)) {
    if (!route.empty()) std::remove(route.c_str());
    if (!protected_here) return VELOC_FAILURE;  // sync_protected said why
    if (flags[0] == 0 && !(success != 0 && (file || mem)))
      return fail(__func__, success ? "nothing to checkpoint (no VELOC_Checkpoint_mem or VELOC_Route_file)"
                                    : "the application reported failure: version " + std::to_string(version) +
                                          " of '" + name + "' is not taken (cairn never keeps a partial version)");
    if (flags[0] == 0) return fail(__func__, "another rank reported failure (or could not protect its regions): version not taken");
    return fail(__func__, "ranks mixed a routed file and memory regions in one checkpoint: version not taken");
  }
  int rc;
  if (file) {
    rc = cairn_checkpoint_begin(g->c, name.c_str(), version);
    if (rc != CAIRN_OK) {
      std::remove(route.c_str());
      return fail_cairn(__func__, rc);
    }
    char buf[4096];
    std::string why;
    bool moved = false;
    int rrc = cairn_route_file(g->c, (name + "-" + std::to_string(g->rank) + "-" + std::to_string(version) + ".dat").c_str(),
                               buf, sizeof buf);
    if (rrc == CAIRN_OK) {
      struct stat sb;
      if (::stat(route.c_str(), &sb) != 0)
        why = "the routed file " + route + " was not written";
      else
        moved = move_file(route, buf, &why);
    } else {
      why = cairn_last_error();
    }
    if (!moved) {
      std::remove(route.c_str());
      std::fprintf(stderr, "VELOC (cairn): VELOC_Checkpoint_end: %s\n", why.c_str());
    }
    rc = cairn_checkpoint_end(g->c, moved ? 1 : 0);  // collective: one failing rank fails all
  } else {
    rc = cairn_checkpoint(g->c, name.c_str(), version);
  }
  // CAIRN_EEARLIER: this version was taken; an earlier one failed (a warning).
  if (rc == CAIRN_EEARLIER) std::fprintf(stderr, "VELOC (cairn): warning: %s\n", cairn_last_error());
  else if (rc != CAIRN_OK) return fail_cairn(__func__, rc);
  g->have_last = true;
  g->last_name = name;
  g->last_version = version;
  return VELOC_SUCCESS;
}

int VELOC_Checkpoint(const char* name, int version) {
  VELOC_NEED_INIT(__func__);
  // VELOC waits for the previous checkpoint here; cairn's staging slots give
  // the same back-pressure without waiting for its flush (compat.md).
  if (VELOC_Checkpoint_begin(name, version) != VELOC_SUCCESS) return VELOC_FAILURE;
  if (VELOC_Checkpoint_mem() != VELOC_SUCCESS) {
    (void)VELOC_Checkpoint_end(0);
    return VELOC_FAILURE;
  }
  return VELOC_Checkpoint_end(1);
}

int VELOC_Checkpoint_wait(void) {
  VELOC_NEED_INIT(__func__);
  if (g->ph == phase::checkpoint) return fail(__func__, "finish the open checkpoint with VELOC_Checkpoint_end first");
  if (!g->have_last) return VELOC_SUCCESS;
  int rc = cairn_wait(g->c, g->last_name.c_str(), g->last_version, CAIRN_LEVEL_PERSISTENT);
  if (rc == CAIRN_ENOTFOUND)  // not scheduled for the persistent level (CAIRN_PERSISTENT_INTERVAL)
    rc = cairn_wait(g->c, g->last_name.c_str(), g->last_version, CAIRN_LEVEL_LOCAL);
  return rc == CAIRN_OK ? VELOC_SUCCESS : fail_cairn(__func__, rc);
}

int VELOC_Checkpoint_finished(void) {
  VELOC_NEED_INIT(__func__);
  if (g->ph == phase::checkpoint) return fail(__func__, "finish the open checkpoint with VELOC_Checkpoint_end first");
  if (!g->have_last) return VELOC_SUCCESS;
  unsigned levels = 0;
  int rc = cairn_test(g->c, g->last_name.c_str(), g->last_version, &levels);
  if (rc != CAIRN_OK) return fail_cairn(__func__, rc);
  return (levels & CAIRN_LEVEL_PERSISTENT) ? VELOC_SUCCESS : VELOC_FAILURE;
}

int VELOC_Cleanup(const char* name) {
  VELOC_NEED_INIT(__func__);
  (void)name;
  return VELOC_SUCCESS;
}

int VELOC_Restart_test(const char* name, int version) {
  VELOC_NEED_INIT(__func__);
  if (!valid_name(name) || version < 0)
    return fail(__func__, std::string("checkpoint name '") + (name ? name : "(null)") + "' or version " +
                              std::to_string(version) + " invalid");
  int64_t v = -1;
  int rc = version > 0 ? cairn_restart_test_max(g->c, name, version, &v) : cairn_restart_test(g->c, name, &v);
  if (rc == CAIRN_ENOTFOUND) return VELOC_FAILURE;  // no checkpoint: a fresh start, as with VELOC
  if (rc != CAIRN_OK) return fail_cairn(__func__, rc);
  if (v > INT_MAX) return fail(__func__, "version " + std::to_string(v) + " does not fit VELOC's int");
  return static_cast<int>(v);
}

int VELOC_Restart_begin(const char* name, int version) {
  VELOC_NEED_INIT(__func__);
  if (g->ph != phase::none)
    return fail(__func__, "a checkpoint or restart sequence is already open (call the matching _end first)");
  if (!valid_name(name) || version < 0)
    return fail(__func__, std::string("checkpoint name '") + (name ? name : "(null)") + "' or version " +
                              std::to_string(version) + " invalid");
  int rc = cairn_restart_begin(g->c, name, version);
  if (rc != CAIRN_OK) return fail_cairn(__func__, rc);
  g->ph = phase::restart;
  g->name = name;
  g->version = version;
  return VELOC_SUCCESS;
}

int VELOC_Recover_size(int id) {
  VELOC_NEED_INIT(__func__);
  if (g->ph != phase::restart) return fail(__func__, "call VELOC_Restart_begin first");
  uint64_t bytes = 0;
  int rc = cairn_restart_region_size(g->c, region_name(id).c_str(), &bytes);
  if (rc == CAIRN_ENOTFOUND) return VELOC_FAILURE;
  if (rc != CAIRN_OK) return fail_cairn(__func__, rc);
  if (bytes > static_cast<uint64_t>(INT_MAX)) return fail(__func__, "region size does not fit VELOC's int");
  return static_cast<int>(bytes);
}

int VELOC_Recover_selective(int mode, int* ids, int id_count) {
  VELOC_NEED_INIT(__func__);
  if (g->ph != phase::restart) return fail(__func__, "call VELOC_Restart_begin first");
  if (mode != VELOC_RECOVER_ALL && mode != VELOC_RECOVER_SOME && mode != VELOC_RECOVER_REST)
    return fail(__func__, "mode must be VELOC_RECOVER_ALL, VELOC_RECOVER_SOME or VELOC_RECOVER_REST");
  auto want = select(current_group(g->name), mode, ids, id_count);
  // As VELOC: a region may be protected larger than it was checkpointed.
  std::string why;
  for (auto& [id, r] : want) {
    uint64_t bytes = 0;
    int rc = cairn_restart_region_size(g->c, region_name(id).c_str(), &bytes);
    if (rc != CAIRN_OK) {
      why = "region " + std::to_string(id) + ": " + cairn_last_error();
      break;
    }
    if (bytes > r.bytes) {
      why = "protected region " + std::to_string(id) + " is too small (" + std::to_string(r.bytes) +
            " bytes) for its checkpointed size (" + std::to_string(bytes) + " bytes); buffers left untouched";
      break;
    }
    r.bytes = bytes;
  }
  if (want.empty()) why = "empty selection of memory regions: protect regions with VELOC_Mem_protect first";
  if (why.empty() && sync_protected(__func__, want) != VELOC_SUCCESS) why = "protection failed";
  bool ok = all_ranks(why.empty());
  if (!ok) return fail(__func__, why.empty() ? "another rank could not recover (see its message)" : why);
  int rc = cairn_restart(g->c, g->name.c_str(), g->version);
  return rc == CAIRN_OK ? VELOC_SUCCESS : fail_cairn(__func__, rc);
}

int VELOC_Recover_mem(void) { return VELOC_Recover_selective(VELOC_RECOVER_ALL, nullptr, 0); }

int VELOC_Restart_end(int success) {
  VELOC_NEED_INIT(__func__);
  if (g->ph != phase::restart) return fail(__func__, "call VELOC_Restart_begin first");
  end_sequence();
  int rc = cairn_restart_end(g->c, success);
  return rc == CAIRN_OK ? VELOC_SUCCESS : fail_cairn(__func__, rc);
}

int VELOC_Restart(const char* name, int version) {
  if (VELOC_Restart_begin(name, version) != VELOC_SUCCESS) return VELOC_FAILURE;
  int rc = VELOC_Recover_mem();
  int rc2 = VELOC_Restart_end(rc == VELOC_SUCCESS);
  return rc == VELOC_SUCCESS && rc2 == VELOC_SUCCESS ? VELOC_SUCCESS : VELOC_FAILURE;
}

}  // extern "C"
