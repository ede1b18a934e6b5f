// SCR client API subset (compat/scr/include/scr.h) over cairn's C API.
//
// A checkpoint dataset is version <id> of the cairn checkpoint "scr" in file
// mode: each rank's routed files, plus a small file "scr.dataset" holding the
// dataset's name and flags. A file routed by several ranks (a shared file) is
// kept by the lowest of them. Output-only datasets are written in place.
// docs/design/compat.md describes the mapping and the differences from SCR.
#include "scr.h"

#include <cairn_mpi.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <set>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace {

constexpr int kFailure = 1;
constexpr const char* kCkpt = "scr";            // cairn checkpoint name
constexpr const char* kMeta = "scr.dataset";    // per-rank file holding the dataset's name and flags

int fail(const char* fn, const std::string& what) {
  std::fprintf(stderr, "SCR (cairn): %s: %s\n", fn, what.c_str());
  std::fflush(stderr);
  return kFailure;
}

int fail_cairn(const char* fn, int code) {
  const char* msg = cairn_last_error();
  return fail(fn, std::string(cairn_strerror(code)) + ": " + (msg && *msg ? msg : "(no message)"));
}

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

std::map<std::string, std::string>& set_params() {
  static std::map<std::string, std::string> m;
  return m;
}

// The user's configuration file (SCR_CONF_FILE, else <prefix>/.scrconf), read at SCR_Init.
std::map<std::string, std::string>& file_params() {
  static std::map<std::string, std::string> m;
  return m;
}

// A checkpoint descriptor ("CKPT=<id> KEY=VALUE ..."): id -> keys (upper case).
using descriptor = std::map<std::string, std::string>;
std::map<long, descriptor>& set_descriptors() {
  static std::map<long, descriptor> m;
  return m;
}
std::map<long, descriptor>& file_descriptors() {
  static std::map<long, descriptor> m;
  return m;
}

// SCR_Config values win over the environment, and the environment over the
// configuration file, as in SCR.
std::string param(const std::string& key, const std::string& dflt = "") {
  auto it = set_params().find(key);
  if (it != set_params().end()) return it->second;
  const char* v = std::getenv(key.c_str());
  if (v && *v) return v;
  it = file_params().find(key);
  return it != file_params().end() ? it->second : dflt;
}

std::string upper(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}

// "<id> KEY=VALUE ..." (what follows "CKPT=") into *out. false: *why says what is wrong.
bool parse_descriptor(const std::string& text, std::map<long, descriptor>* out, std::string* why) {
  std::istringstream in(text);
  std::string id_text, word;
  in >> id_text;
  char* end = nullptr;
  long id = std::strtol(id_text.c_str(), &end, 10);
  if (id_text.empty() || *end || id < 0) {
    *why = "checkpoint descriptor 'CKPT=" + text + "': the id must be an integer >= 0";
    return false;
  }
  descriptor d;
  while (in >> word) {
    size_t eq = word.find('=');
    if (eq == std::string::npos || eq == 0) {
      *why = "checkpoint descriptor 'CKPT=" + text + "': '" + word + "' is not KEY=VALUE";
      return false;
    }
    d[upper(word.substr(0, eq))] = word.substr(eq + 1);
  }
  (*out)[id] = std::move(d);
  return true;
}

// Reads SCR's user configuration file: "KEY=VALUE" lines, "CKPT=<id> ..."
// descriptors, '#' comments. Other descriptors (STORE=..., CNTL=...) are
// ignored: cairn has one node-local directory (SCR_CACHE_BASE).
bool read_conf_file(const std::string& prefix, std::string* why) {
  file_params().clear();
  file_descriptors().clear();
  std::string path = param("SCR_CONF_FILE");
  bool must = !path.empty();
  if (path.empty()) path = prefix + "/.scrconf";
  std::ifstream in(path);
  if (!in) {
    if (must) *why = "SCR_CONF_FILE = " + path + ": cannot open it";
    return !must;
  }
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    size_t b = line.find_first_not_of(" \t"), e = line.find_last_not_of(" \t\r");
    if (b == std::string::npos) continue;
    line = line.substr(b, e - b + 1);
    size_t eq = line.find('=');
    if (eq == std::string::npos) {
      *why = path + ":" + std::to_string(n) + ": '" + line + "' is not KEY=VALUE";
      return false;
    }
    std::string key = upper(line.substr(0, eq)), value = line.substr(eq + 1);
    if (key == "CKPT") {
      if (!parse_descriptor(value, &file_descriptors(), why)) {
        *why = path + ":" + std::to_string(n) + ": " + *why;
        return false;
      }
    } else if (value.find(' ') == std::string::npos || key.rfind("SCR_", 0) == 0) {
      file_params()[key] = value;
    }
  }
  return true;
}

bool param_int(const std::string& key, long dflt, long lo, long* out, std::string* why) {
  std::string v = param(key);
  if (v.empty()) {
    *out = dflt;
    return true;
  }
  char* end = nullptr;
  errno = 0;
  long n = std::strtol(v.c_str(), &end, 10);
  if (errno || *end || n < lo) {
    *why = key + " = '" + v + "' must be an integer >= " + std::to_string(lo);
    return false;
  }
  *out = n;
  return true;
}

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

long gcd(long a, long b) { return b == 0 ? a : gcd(b, a % b); }

// SCR's redundancy (SCR_COPY_TYPE, SCR_SET_SIZE, SCR_SET_FAILURES, SCR_GROUP,
// or with SCR_COPY_TYPE=FILE the CKPT descriptors) as cairn's keys: one
// scheme over sets of ranks on distinct nodes, every n-th dataset. What cannot
// be expressed exactly is warned about (rank 0, once). false: *why.
bool translate_redundancy(bool rank0, std::ostringstream* toml, std::string* store, std::string* why) {
  auto warn = [&](const std::string& text) {
    if (rank0) std::fprintf(stderr, "SCR (cairn): warning: %s\n", text.c_str());
  };
  long set_size = 8, failures = 2;
  if (!param_int("SCR_SET_SIZE", 8, 2, &set_size, why) || !param_int("SCR_SET_FAILURES", 2, 1, &failures, why))
    return false;
  std::map<long, descriptor> descs;
  const std::string copy = upper(param("SCR_COPY_TYPE", "XOR"));
  if (copy == "SINGLE" || copy == "PARTNER" || copy == "XOR" || copy == "RS") {
    descs[0] = {{"TYPE", copy}};
  } else {
    descs = file_descriptors();
    for (const auto& [id, d] : set_descriptors()) descs[id] = d;
    if (descs.empty()) {
      *why = "SCR_COPY_TYPE = " + copy + ": no checkpoint descriptor (CKPT=0 TYPE=XOR ...) in SCR_CONF_FILE or "
             "SCR_Config; SCR_COPY_TYPE is one of SINGLE, PARTNER, XOR, RS, or FILE with descriptors";
      return false;
    }
  }
  struct scheme {
    long id, interval, set, failures;
    std::string type;
  };
  std::vector<scheme> protect;  // the descriptors that are not SINGLE
  std::set<std::string> stores, groups;
  for (const auto& entry : descs) {
    const long id = entry.first;
    const descriptor& d = entry.second;
    auto get = [&](const char* k, const std::string& dflt) {
      auto it = d.find(k);
      return it == d.end() ? dflt : it->second;
    };
    auto num = [&](const char* k, long dflt, long lo, long* v) {
      std::string text = get(k, std::to_string(dflt));
      char* end = nullptr;
      *v = std::strtol(text.c_str(), &end, 10);
      if (text.empty() || *end || *v < lo) {
        *why = "checkpoint descriptor CKPT=" + std::to_string(id) + ": " + k + " = '" + text +
               "' must be an integer >= " + std::to_string(lo);
        return false;
      }
      return true;
    };
    scheme sc{id, 1, set_size, failures, upper(get("TYPE", copy == "FILE" ? "XOR" : copy))};
    if (!num("INTERVAL", 1, 1, &sc.interval) || !num("SET_SIZE", set_size, 2, &sc.set) ||
        !num("SET_FAILURES", failures, 1, &sc.failures))
      return false;
    if (sc.type != "SINGLE" && sc.type != "PARTNER" && sc.type != "XOR" && sc.type != "RS") {
      *why = "checkpoint descriptor CKPT=" + std::to_string(id) + ": TYPE = '" + sc.type +
             "' is not SINGLE, PARTNER, XOR or RS";
      return false;
    }
    stores.insert(get("STORE", ""));
    groups.insert(upper(get("GROUP", param("SCR_GROUP", "NODE"))));
    if (sc.type != "SINGLE") protect.push_back(sc);
  }
  stores.erase("");
  if (!stores.empty()) {
    *store = *stores.begin();
    if (stores.size() > 1)
      warn("checkpoint descriptors name " + std::to_string(stores.size()) + " STOREs; cairn keeps datasets in one "
           "node-local directory: " + *store);
  }
  for (const auto& gr : groups)
    if (gr != "NODE")
      warn("GROUP = " + gr + ": cairn forms redundancy sets of ranks on distinct nodes (its failure domain, "
           "CAIRN_NODE_ID or the host)");
  if (protect.empty()) {
    *toml << "redundancy = \"none\"\n";
    return true;
  }
  // One scheme: the most frequent descriptor's, on every n-th dataset, n the
  // greatest common divisor of the protecting intervals (a superset of the
  // datasets SCR would protect).
  const scheme& use = *std::min_element(protect.begin(), protect.end(), [](const scheme& a, const scheme& b) {
    return a.interval != b.interval ? a.interval < b.interval : a.id < b.id;
  });
  long every = 0;
  for (const auto& sc : protect) {
    every = gcd(every, sc.interval);
    if (sc.type != use.type || sc.set != use.set || (sc.type == "RS" && sc.failures != use.failures))
      warn("checkpoint descriptor CKPT=" + std::to_string(sc.id) + " (" + sc.type + ") is not applied: cairn "
           "protects a run with one scheme, CKPT=" + std::to_string(use.id) + "'s " + use.type);
  }
  if (protect.size() < descs.size() && every < use.interval)
    warn("redundancy every " + std::to_string(every) + " dataset(s): some datasets SCR would keep as SINGLE are "
         "protected too");
  std::string type = use.type;
  for (char& ch : type) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  *toml << "redundancy = " << toml_string(type) << "\nredundancy_set = " << use.set
        << "\nrs_parity = " << use.failures << "\nredundancy_interval = " << every
        << "\nredundancy_required = false\n";
  return true;
}

std::string base_name(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string absolute(const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  char cwd[PATH_MAX];
  if (getcwd(cwd, sizeof cwd) == nullptr) return path;
  return std::string(cwd) + "/" + path;
}

bool make_dirs(const std::string& path) {
  std::string cur = path.empty() || path[0] != '/' ? "" : "/";
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  return true;
}

std::string dir_name(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// A stable tag for a full path (FNV-1a): routed files of one dataset are
// named by their original path, so ranks routing the same one share it.
std::string path_tag(const std::string& path) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char ch : path) h = (h ^ ch) * 1099511628211ULL;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

bool copy_file(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  if (!in) return false;
  std::string tmp = to + ".scr-tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << in.rdbuf();
    out.flush();
    if (!out) return false;
  }
  return std::rename(tmp.c_str(), to.c_str()) == 0;
}

bool move_file(const std::string& from, const std::string& to, std::string* why) {
  if (std::rename(from.c_str(), to.c_str()) == 0) return true;
  if (errno == EXDEV && copy_file(from, to)) {
    std::remove(from.c_str());
    return true;
  }
  *why = "cannot move " + from + " to " + to + ": " + std::strerror(errno);
  return false;
}

// Which file a path names: two ranks see one shared file only when these match.
struct file_id {
  uint64_t dev = 0, ino = 0;
  int64_t size = -1;  // -1: missing
  bool operator==(const file_id& o) const { return dev == o.dev && ino == o.ino && size == o.size; }
};

file_id identify(const std::string& path) {
  struct stat sb;
  if (::stat(path.c_str(), &sb) != 0) return {};
  return {static_cast<uint64_t>(sb.st_dev), static_cast<uint64_t>(sb.st_ino), static_cast<int64_t>(sb.st_size)};
}

enum class phase { none, output, restart_offered, restarting };

struct scr_state {
  cairn_t* c = nullptr;
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  std::string prefix;
  long interval = 0, seconds = 0, overhead = 0, halt_seconds = 0;

  phase ph = phase::none;
  // Output phase.
  int64_t id = 0;        // this dataset's id (cairn version)
  int64_t next_id = 1;   // the next dataset's id
  // The newest dataset earlier executions committed: as SCR, new ids go
  // above the highest in the prefix's index even when nothing was restarted.
  int64_t committed = 0;
  std::string name;
  int flags = 0;
  bool in_cairn = false;  // a checkpoint dataset: cairn file mode is open
  struct routed_file {
    std::string full;  // the original path (absolute)
    std::string path;  // where the application writes it (shared by the ranks routing the same original)
  };
  std::map<std::string, routed_file> routed;  // base name -> file
  std::string route_dir;  // this dataset's routed files
  // SCR_CACHE_BYPASS=1: routed files are written under the prefix, which every
  // node sees, so a file shared by ranks on different nodes is one file.
  bool bypass = false;
  std::string exec_tag;  // this execution (rank 0's random tag): bypass directories
  double started = 0;
  // Restart.
  int64_t restart_cap = -1;  // after a failed restart: offer versions at or below this
  int64_t offered = -1;
  int64_t newest_offered = -1;  // in this execution: new datasets go above it
  std::string offered_name;
  std::map<std::string, std::string> restart_shared;  // base name -> readable path of a shared file
  std::string wanted;  // SCR_Current
  // Need_checkpoint (rank 0's view, broadcast).
  long calls = 0;
  double last_end = 0, last_cost = -1;
};

scr_state* g = nullptr;

#define SCR_NEED_INIT(fn) \
  if (g == nullptr) return fail(fn, "SCR is not initialized (call SCR_Init first)")

bool all_ranks(bool mine) {
  int v = mine ? 1 : 0, out = 0;
  MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MIN, g->comm);
  return out == 1;
}

// SCR_CACHE_BYPASS: this execution's routed files under the prefix.
std::string bypass_root() { return g->prefix + "/.scr/route." + g->exec_tag; }

int bcast_flag(int mine) {
  MPI_Bcast(&mine, 1, MPI_INT, 0, g->comm);
  return mine;
}

// Every rank's `mine`, in rank order. Collective.
std::vector<std::string> allgather_text(const std::string& mine) {
  int nranks = 0;
  MPI_Comm_size(g->comm, &nranks);
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(nranks), displs(nranks);
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, g->comm);
  int total = 0;
  for (int r = 0; r < nranks; ++r) {
    displs[r] = total;
    total += lens[r];
  }
  std::vector<char> all(static_cast<size_t>(total) + 1);
  MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, g->comm);
  std::vector<std::string> out;
  for (int r = 0; r < nranks; ++r) out.emplace_back(all.data() + displs[r], static_cast<size_t>(lens[r]));
  return out;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line))
    if (!line.empty()) out.push_back(line);
  return out;
}

void bcast_string(std::string* s, int root) {
  long n = static_cast<long>(s->size());
  MPI_Bcast(&n, 1, MPI_LONG, root, g->comm);
  s->resize(static_cast<size_t>(n));
  MPI_Bcast(s->data(), static_cast<int>(n), MPI_CHAR, root, g->comm);
}

// A shared file this rank routed in a dataset: kept in `owner`'s files under `base`.
struct shared_entry {
  int owner;
  std::string base;
  bool operator<(const shared_entry& o) const { return owner != o.owner ? owner < o.owner : base < o.base; }
};

// Reads the restored dataset file: name, flags, then "shared <owner> <base>"
// for each shared file this rank routed.
bool read_meta(std::string* name, std::vector<shared_entry>* shared, std::string* why) {
  char buf[4096];
  int rc = cairn_route_file(g->c, kMeta, buf, sizeof buf);
  if (rc != CAIRN_OK) {
    *why = cairn_last_error();
    return false;
  }
  std::ifstream in(buf);
  std::string line;
  if (!std::getline(in, line)) {
    *why = std::string("cannot read ") + buf;
    return false;
  }
  *name = line;
  std::getline(in, line);  // flags
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string word, base;
    int owner = -1;
    if (!(ls >> word >> owner) || word != "shared" || owner < 0 || !std::getline(ls >> std::ws, base) ||
        base.empty() || base.find('/') != std::string::npos) {
      *why = std::string(buf) + ": unreadable line '" + line + "'";
      return false;
    }
    shared->push_back({owner, base});
  }
  return true;
}

// Restart: makes every shared file of the offered dataset readable on each
// rank that routed it, at the path its owner restored it to when this rank
// sees that file, else as a local copy the owner sends. Collective.
bool resolve_shared(const std::vector<shared_entry>& mine, std::string* why) {
  g->restart_shared.clear();
  std::string text;
  for (const auto& e : mine) text += std::to_string(e.owner) + " " + e.base + "\n";
  std::vector<shared_entry> all;
  for (const auto& blob : allgather_text(text))
    for (const auto& line : split_lines(blob)) {
      size_t sp = line.find(' ');
      all.push_back({std::atoi(line.substr(0, sp).c_str()), line.substr(sp + 1)});
    }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end(),
                        [](const shared_entry& a, const shared_entry& b) { return !(a < b) && !(b < a); }),
            all.end());
  bool ok = true;
  for (const auto& e : all) {
    const bool needs = std::any_of(mine.begin(), mine.end(),
                                   [&](const shared_entry& m) { return !(m < e) && !(e < m); });
    std::string path;
    file_id id;
    if (g->rank == e.owner) {
      char buf[4096];
      if (cairn_route_file(g->c, e.base.c_str(), buf, sizeof buf) == CAIRN_OK) {
        path = buf;
        id = identify(path);
      }
    }
    bcast_string(&path, e.owner);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, e.owner, g->comm);
    if (id.size < 0) {
      *why = "shared file '" + e.base + "' is missing from rank " + std::to_string(e.owner) + "'s files";
      return false;
    }
    const bool visible = !needs || identify(path) == id;
    if (needs) g->restart_shared[e.base] = path;
    if (all_ranks(visible)) continue;
    // Another node: the owner sends the file, each rank that cannot see it keeps a copy.
    std::string local;
    int out = -1;
    if (!visible) {
      char buf[4096];
      if (cairn_route_file(g->c, kMeta, buf, sizeof buf) == CAIRN_OK)
        local = dir_name(buf) + "/shared-" + std::to_string(e.owner) + "-" + e.base;
      out = local.empty() ? -1 : ::open(local.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      g->restart_shared[e.base] = local;
    }
    int in = g->rank == e.owner ? ::open(path.c_str(), O_RDONLY) : -1;
    bool mine_ok = visible || out >= 0;
    std::vector<char> chunk(size_t{64} << 20);
    for (;;) {
      long n = 0;
      if (g->rank == e.owner) n = in < 0 ? -1 : static_cast<long>(::read(in, chunk.data(), chunk.size()));
      MPI_Bcast(&n, 1, MPI_LONG, e.owner, g->comm);
      if (n <= 0) {
        if (n < 0) mine_ok = false;
        break;
      }
      MPI_Bcast(chunk.data(), static_cast<int>(n), MPI_CHAR, e.owner, g->comm);
      if (out >= 0 && ::write(out, chunk.data(), static_cast<size_t>(n)) != n) mine_ok = false;
    }
    if (in >= 0) ::close(in);
    if (out >= 0 && ::close(out) != 0) mine_ok = false;
    if (!all_ranks(mine_ok)) {
      *why = "cannot copy shared file '" + e.base + "' from rank " + std::to_string(e.owner) + " to the ranks on other nodes";
      ok = false;
    }
  }
  return ok;
}

// Opens the restart of the newest dataset at or below cap (< 0: any) that
// every rank can restore, and sets offered/offered_name. false: none.
bool offer(const char* fn, int64_t cap, bool* error) {
  *error = false;
  int64_t v = -1;
  int rc = cap >= 0 ? cairn_restart_test_max(g->c, kCkpt, cap, &v) : cairn_restart_test(g->c, kCkpt, &v);
  if (rc == CAIRN_ENOTFOUND) return false;
  if (rc != CAIRN_OK) {
    *error = true;
    fail_cairn(fn, rc);
    return false;
  }
  rc = cairn_restart_begin(g->c, kCkpt, v);
  if (rc != CAIRN_OK) {
    *error = true;
    fail_cairn(fn, rc);
    return false;
  }
  std::string name, why;
  std::vector<shared_entry> shared;
  bool ok = all_ranks(read_meta(&name, &shared, &why)) && resolve_shared(shared, &why);
  if (!ok) {
    (void)cairn_restart_end(g->c, 0);
    *error = true;
    fail(fn, "dataset " + std::to_string(v) + ": " + (why.empty() ? "unreadable on another rank" : why));
    return false;
  }
  g->offered = v;
  g->newest_offered = std::max(g->newest_offered, v);
  g->offered_name = name;
  return true;
}

void copy_name(char* out, const std::string& name) {
  if (out == nullptr) return;
  size_t n = std::min(name.size(), static_cast<size_t>(SCR_MAX_FILENAME - 1));
  std::memcpy(out, name.data(), n);
  out[n] = '\0';
}

}  // namespace

extern "C" {

const char* SCR_Config(const char* config) {
  if (config == nullptr) return nullptr;
  std::string s = config;
  size_t eq = s.find('=');
  if (eq == std::string::npos) {
    std::string v = param(s);
    return v.empty() ? nullptr : strdup(v.c_str());
  }
  if (g != nullptr) {
    fail(__func__, "parameters can be set only before SCR_Init");
    return nullptr;
  }
  std::string key = s.substr(0, eq), value = s.substr(eq + 1);
  if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
  if (upper(key) == "CKPT") {
    std::string why;
    if (!parse_descriptor(value, &set_descriptors(), &why)) fail(__func__, why);
    return nullptr;
  }
  if (value.empty())
    set_params().erase(key);
  else
    set_params()[key] = value;
  return nullptr;
}

const char* SCR_Configf(const char* format, ...) {
  if (format == nullptr) return nullptr;
  va_list ap;
  va_start(ap, format);
  va_list again;
  va_copy(again, ap);
  const int n = std::vsnprintf(nullptr, 0, format, ap);
  va_end(ap);
  if (n < 0) {
    va_end(again);
    fail(__func__, "cannot format the configuration text");
    return nullptr;
  }
  std::vector<char> text(static_cast<size_t>(n) + 1);
  std::vsnprintf(text.data(), text.size(), format, again);
  va_end(again);
  return SCR_Config(text.data());
}

int SCR_Drop(const char* name) {
  return fail(__func__, std::string("dataset '") + (name ? name : "") +
                            "': removing datasets from the index is not provided by the cairn drop-in; they are "
                            "kept until `cairn gc` removes them (docs/design/compat.md)");
}

int SCR_Delete(const char* name) {
  return fail(__func__, std::string("dataset '") + (name ? name : "") +
                            "': deleting datasets is not provided by the cairn drop-in; remove them with `cairn gc` "
                            "(docs/design/compat.md)");
}

int SCR_Init(void) {
  if (g != nullptr) return fail(__func__, "SCR is already initialized");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return fail(__func__, "MPI is not initialized: call MPI_Init before SCR_Init");
  auto st = std::make_unique<scr_state>();
  MPI_Comm_dup(MPI_COMM_WORLD, &st->comm);
  MPI_Comm_rank(st->comm, &st->rank);
  std::string why;
  long cache_size = 0, flush = 0;
  st->prefix = absolute(param("SCR_PREFIX", "."));
  std::ostringstream toml;
  std::string store;  // the descriptors' STORE
  bool ok = read_conf_file(st->prefix, &why) && translate_redundancy(st->rank == 0, &toml, &store, &why) &&
            param_int("SCR_CHECKPOINT_INTERVAL", 0, 0, &st->interval, &why) &&
            param_int("SCR_CHECKPOINT_SECONDS", 0, 0, &st->seconds, &why) &&
            param_int("SCR_CHECKPOINT_OVERHEAD", 0, 0, &st->overhead, &why) &&
            param_int("SCR_HALT_SECONDS", 0, 0, &st->halt_seconds, &why) &&
            param_int("SCR_CACHE_SIZE", 2, 0, &cache_size, &why) && param_int("SCR_FLUSH", 1, 0, &flush, &why);
  toml << "persistent = " << toml_string(st->prefix + "/.scr/cairn") << "\n";
  std::string cache = param("SCR_CACHE_BASE", store);
  if (!cache.empty()) toml << "scratch = " << toml_string(absolute(cache) + "/scr-cairn") << "\n";
  // SCR_FLUSH = 0: datasets stay in the cache (the node-local level), none
  // is copied to the prefix; a rerun restarts from the cache.
  toml << "keep_local = " << cache_size << "\npersistent_interval = " << (flush == 0 ? (1L << 30) : flush) << "\n";
  // SCR keeps its cache (SCR_CACHE_SIZE datasets) after the run: the next run
  // in the allocation restarts from it.
  toml << "keep_local_after_finalize = true\n";
  // SCR users expect the next job to restart: the default run names the
  // program and its directory, not the job (docs/design/compat.md).
  toml << "run_scope = \"program\"\n";
  std::string path;
  if (ok) {
    const char* dir = std::getenv("TMPDIR");
    std::string tmpl = std::string(dir && *dir ? dir : "/tmp") + "/scr-cairn-XXXXXX";
    std::vector<char> name(tmpl.begin(), tmpl.end());
    name.push_back('\0');
    int fd = mkstemp(name.data());
    std::string text = toml.str();
    if (fd < 0 || ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
      ok = false;
      why = "cannot write a temporary configuration in " + tmpl + ": " + std::strerror(errno);
    }
    if (fd >= 0) ::close(fd);
    path = name.data();
  }
  int v = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&v, &all, 1, MPI_INT, MPI_MIN, st->comm);
  if (all == 0) {
    if (!path.empty()) ::unlink(path.c_str());
    MPI_Comm_free(&st->comm);
    return fail(__func__, ok ? "another rank failed (see its message)" : why);
  }
  int rc = cairn_init_mpi(st->comm, path.c_str(), &st->c);
  ::unlink(path.c_str());
  if (rc != CAIRN_OK) {
    MPI_Comm_free(&st->comm);
    return fail_cairn(__func__, rc);
  }
  int64_t newest = -1;
  rc = cairn_committed_newest(st->c, kCkpt, &newest);
  if (rc != CAIRN_OK && rc != CAIRN_ENOTFOUND) {
    (void)cairn_finalize(&st->c, 0);
    MPI_Comm_free(&st->comm);
    return fail_cairn(__func__, rc);
  }
  st->bypass = param("SCR_CACHE_BYPASS", "0") != "0";
  unsigned tag = 0;
  if (st->rank == 0) {
    std::FILE* f = std::fopen("/dev/urandom", "rb");
    if (f == nullptr || std::fread(&tag, sizeof tag, 1, f) != 1) tag = static_cast<unsigned>(getpid() ^ time(nullptr));
    if (f != nullptr) std::fclose(f);
  }
  MPI_Bcast(&tag, 1, MPI_UNSIGNED, 0, st->comm);
  char tag_text[16];
  std::snprintf(tag_text, sizeof tag_text, "%08x", tag);
  st->exec_tag = tag_text;
  st->committed = std::max<int64_t>(newest, 0);
  st->next_id = st->committed + 1;
  st->last_end = now_s();
  g = st.release();
  return SCR_SUCCESS;
}

int SCR_Finalize(void) {
  SCR_NEED_INIT(__func__);
  int ret = SCR_SUCCESS;
  if (g->ph == phase::restart_offered || g->ph == phase::restarting) (void)cairn_restart_end(g->c, 0);
  if (g->ph == phase::output) {
    std::fprintf(stderr, "SCR (cairn): SCR_Finalize: an output phase was left open; its dataset is dropped\n");
    if (g->in_cairn) (void)cairn_checkpoint_end(g->c, 0);
  }
  int rc = cairn_finalize(&g->c, 1);
  if (rc != CAIRN_OK) ret = fail_cairn(__func__, rc);
  if (g->bypass) (void)::rmdir(bypass_root().c_str());  // the last rank's succeeds
  MPI_Comm_free(&g->comm);
  delete g;
  g = nullptr;
  return ret;
}

int SCR_Start_output(const char* name, int flags) {
  SCR_NEED_INIT(__func__);
  if (g->ph == phase::output) return fail(__func__, "an output phase is already open (call SCR_Complete_output)");
  if (g->ph != phase::none) {
    // An offered restart the application did not take: close it.
    (void)cairn_restart_end(g->c, 0);
    g->ph = phase::none;
  }
  if ((flags & (SCR_FLAG_CHECKPOINT | SCR_FLAG_OUTPUT)) == 0)
    return fail(__func__, "flags must include SCR_FLAG_CHECKPOINT or SCR_FLAG_OUTPUT");
  g->id = g->next_id;
  g->name = name && *name ? name : "scr.dataset." + std::to_string(g->id);
  if (g->name.size() >= SCR_MAX_FILENAME || g->name.find('\n') != std::string::npos)
    return fail(__func__, "dataset name too long or with a newline");
  g->flags = flags;
  g->routed.clear();
  g->in_cairn = (flags & SCR_FLAG_CHECKPOINT) != 0;
  g->started = now_s();
  if (g->in_cairn) {
    int rc = cairn_checkpoint_begin(g->c, kCkpt, g->id);
    if (rc != CAIRN_OK) return fail_cairn(__func__, rc);
    // Routed files are named by their original path in a directory that the
    // ranks of a node (with SCR_CACHE_BYPASS, of the job) share: ranks routing
    // one file write one file. Node-local, it sits beside cairn's file-mode
    // directories (this execution's), so handing a file to cairn is a rename.
    char buf[4096];
    rc = cairn_route_file(g->c, kMeta, buf, sizeof buf);
    if (rc != CAIRN_OK) {
      (void)cairn_checkpoint_end(g->c, 0);
      return fail_cairn(__func__, rc);
    }
    g->route_dir = g->bypass ? bypass_root() + "/" + std::to_string(g->id)
                             : dir_name(dir_name(buf)) + "/scr-route." + std::to_string(g->id);
  }
  g->ph = phase::output;
  return SCR_SUCCESS;
}

int SCR_Start_checkpoint(void) { return SCR_Start_output(nullptr, SCR_FLAG_CHECKPOINT); }

int SCR_Route_file(const char* name, char* file) {
  SCR_NEED_INIT(__func__);
  if (name == nullptr || file == nullptr) return fail(__func__, "name and file must not be NULL");
  std::string out;
  std::string base = base_name(name);
  if (g->ph == phase::output) {
    std::string full = absolute(name);
    if (base.empty() || base == kMeta) return fail(__func__, std::string("'") + name + "' is not a usable file name");
    if (!g->in_cairn) {
      // Output only: written in place.
      std::string dir = full.substr(0, full.find_last_of('/'));
      if (!make_dirs(dir)) return fail(__func__, "cannot create " + dir + ": " + std::strerror(errno));
      out = full;
    } else {
      auto it = g->routed.find(base);
      if (it != g->routed.end() && it->second.full != full)
        return fail(__func__, "two files of one dataset share the base name '" + base + "' (" + it->second.full +
                                  ", " + full + "): not supported");
      if (!make_dirs(g->route_dir))
        return fail(__func__, "cannot create " + g->route_dir + ": " + std::strerror(errno));
      out = g->route_dir + "/" + path_tag(full) + "-" + base;
      g->routed[base] = {full, out};
    }
  } else if (g->ph == phase::restarting) {
    auto shared = g->restart_shared.find(base);
    if (shared != g->restart_shared.end()) {
      out = shared->second;
    } else {
      char buf[4096];
      int rc = cairn_route_file(g->c, base.c_str(), buf, sizeof buf);
      if (rc != CAIRN_OK) return fail_cairn(__func__, rc);
      out = buf;
    }
  } else {
    out = name;
  }
  if (out.size() >= SCR_MAX_FILENAME) return fail(__func__, "routed path longer than SCR_MAX_FILENAME");
  copy_name(file, out);
  return SCR_SUCCESS;
}

// Checkpoint dataset: finds the files several ranks routed (shared files;
// each must be one file, seen alike by all of them, and is kept by the
// lowest), then hands this rank's files to cairn. false: `why` says what is wrong.
bool hand_over(bool ok, std::string* why) {
  std::string mine;
  for (const auto& [base, f] : g->routed) mine += f.full + "\n";
  std::map<std::string, std::vector<int>> sharers;  // original path -> ranks routing it
  std::vector<std::string> texts = allgather_text(mine);
  for (int r = 0; r < static_cast<int>(texts.size()); ++r)
    for (const auto& full : split_lines(texts[r])) sharers[full].push_back(r);
  std::map<std::string, int> owner;  // base name -> owner, for this rank's shared files
  bool any_shared = false;
  for (const auto& [full, ranks] : sharers) {
    if (ranks.size() < 2) continue;
    any_shared = true;
    const std::string base = base_name(full);
    const bool mine_too = std::find(ranks.begin(), ranks.end(), g->rank) != ranks.end();
    file_id id;
    if (g->rank == ranks[0]) id = identify(g->routed[base].path);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, ranks[0], g->comm);
    if (!mine_too) continue;
    owner[base] = ranks[0];
    if (id.size < 0) {
      if (ok) *why = "the shared file " + full + " was not written";
      ok = false;
    } else if (!(identify(g->routed[base].path) == id)) {
      // Said even when the application failed: it is why a rank could not open the file.
      ok = false;
      *why = "ranks " + std::to_string(ranks[0]) + " and " + std::to_string(g->rank) + " routed " + full +
             " (a shared file) but see different files: they are on different nodes and the cache is "
             "node-local; set SCR_CACHE_BYPASS=1 to write datasets through the prefix, which every node sees";
    }
  }
  // Nobody moves a shared file before every rank has looked at it.
  if (any_shared && !all_ranks(ok) && ok) {
    ok = false;
    *why = "another rank could not use a shared file (see its message)";
  }
  if (ok) {
    char buf[4096];
    int rc = cairn_route_file(g->c, kMeta, buf, sizeof buf);
    std::ofstream meta(rc == CAIRN_OK ? buf : "/dev/null");
    meta << g->name << "\n" << g->flags << "\n";
    for (const auto& [base, r] : owner) meta << "shared " << r << " " << base << "\n";
    meta.flush();
    ok = rc == CAIRN_OK && static_cast<bool>(meta);
    if (!ok) *why = "cannot write the dataset file";
  }
  for (const auto& [base, f] : g->routed) {
    auto shared = owner.find(base);
    const bool keeps = shared == owner.end() || shared->second == g->rank;
    if (!keeps) continue;  // the owner keeps it
    char buf[4096];
    // Checkpoint and output: the files also go to their paths.
    if (ok && (g->flags & SCR_FLAG_OUTPUT) && (!make_dirs(dir_name(f.full)) || !copy_file(f.path, f.full))) {
      ok = false;
      *why = "cannot copy " + f.path + " to " + f.full;
    }
    if (ok && cairn_route_file(g->c, base.c_str(), buf, sizeof buf) != CAIRN_OK) {
      ok = false;
      *why = cairn_last_error();
    }
    if (ok && !move_file(f.path, buf, why)) ok = false;
    if (!ok) std::remove(f.path.c_str());
  }
  (void)::rmdir(g->route_dir.c_str());  // the last rank of a node (or job) to hand over removes it
  return ok;
}

int SCR_Complete_output(int valid) {
  SCR_NEED_INIT(__func__);
  if (g->ph != phase::output) return fail(__func__, "no output phase is open (call SCR_Start_output)");
  g->ph = phase::none;
  bool ok = valid != 0;
  if (g->in_cairn) {
    std::string why;
    ok = hand_over(ok, &why);
    if (!why.empty()) std::fprintf(stderr, "SCR (cairn): SCR_Complete_output: %s\n", why.c_str());
    int rc = cairn_checkpoint_end(g->c, ok ? 1 : 0);  // collective: every rank's validity
    // CAIRN_EEARLIER: this dataset was taken; an earlier one failed (a warning).
    if (rc == CAIRN_EEARLIER) std::fprintf(stderr, "SCR (cairn): warning: %s\n", cairn_last_error());
    else if (rc != CAIRN_OK) return fail_cairn(__func__, rc);
    g->next_id = g->id + 1;
  } else {
    if (!all_ranks(ok)) return fail(__func__, "some rank reported its output invalid");
    g->next_id = g->id + 1;
  }
  double end = now_s();
  g->last_cost = end - g->started;
  g->last_end = end;
  return SCR_SUCCESS;
}

int SCR_Complete_checkpoint(int valid) { return SCR_Complete_output(valid); }

int SCR_Need_checkpoint(int* flag) {
  SCR_NEED_INIT(__func__);
  if (flag == nullptr) return fail(__func__, "flag is NULL");
  int need = 0;
  if (g->rank == 0) {
    ++g->calls;
    double since = now_s() - g->last_end;
    if (g->interval > 0 && g->calls % g->interval == 0) need = 1;
    if (g->seconds > 0 && since >= g->seconds) need = 1;
    long overhead = g->overhead;
    if (g->interval == 0 && g->seconds == 0 && overhead == 0) overhead = 10;  // default advice: 10 % of run time
    if (overhead > 0) {
      // Checkpoint once the last one's cost is at most `overhead` percent of
      // the time since it ended; before any was measured, at once.
      if (g->last_cost < 0 || g->last_cost * 100.0 <= overhead * since) need = 1;
    }
  }
  *flag = bcast_flag(need);
  if (*flag) g->calls = 0;
  return SCR_SUCCESS;
}

int SCR_Have_restart(int* flag, char* name) {
  SCR_NEED_INIT(__func__);
  if (flag == nullptr) return fail(__func__, "flag is NULL");
  *flag = 0;
  if (g->ph == phase::output) return fail(__func__, "an output phase is open");
  if (g->ph == phase::restart_offered || g->ph == phase::restarting) {
    *flag = 1;
    copy_name(name, g->offered_name);
    return SCR_SUCCESS;
  }
  int64_t cap = g->restart_cap;
  if (cap == -2) return SCR_SUCCESS;  // every checkpoint failed to restart
  for (;;) {
    bool error = false;
    if (!offer(__func__, cap, &error)) return error ? kFailure : SCR_SUCCESS;
    if (g->wanted.empty() || g->offered_name == g->wanted) break;
    (void)cairn_restart_end(g->c, 0);
    if (g->offered == 0) return SCR_SUCCESS;
    cap = g->offered - 1;
  }
  g->ph = phase::restart_offered;
  *flag = 1;
  copy_name(name, g->offered_name);
  return SCR_SUCCESS;
}

int SCR_Start_restart(char* name) {
  SCR_NEED_INIT(__func__);
  if (g->ph != phase::restart_offered) {
    int flag = 0;
    if (SCR_Have_restart(&flag, nullptr) != SCR_SUCCESS) return kFailure;
    if (!flag) return fail(__func__, "no checkpoint to restart from (check SCR_Have_restart first)");
  }
  g->ph = phase::restarting;
  copy_name(name, g->offered_name);
  return SCR_SUCCESS;
}

int SCR_Complete_restart(int valid) {
  SCR_NEED_INIT(__func__);
  if (g->ph != phase::restarting) return fail(__func__, "no restart is open (call SCR_Start_restart)");
  g->ph = phase::none;
  bool ok = all_ranks(valid != 0);
  int rc = cairn_restart_end(g->c, ok ? 1 : 0);
  if (ok && rc == CAIRN_OK) {
    // After a fall back to an older dataset, the newer ones stay committed
    // (cairn never replaces a committed version): new datasets go above them.
    g->next_id = std::max({g->offered, g->newest_offered, g->committed}) + 1;
    g->restart_cap = -1;
    g->wanted.clear();
    return SCR_SUCCESS;
  }
  // The next SCR_Have_restart offers an older checkpoint.
  g->restart_cap = g->offered - 1;
  if (g->restart_cap < 0) g->restart_cap = -2;
  if (rc != CAIRN_OK) return fail_cairn(__func__, rc);
  return fail(__func__, "some rank could not read its files of dataset '" + g->offered_name +
                            "'; SCR_Have_restart offers the previous one");
}

int SCR_Current(const char* name) {
  SCR_NEED_INIT(__func__);
  if (name == nullptr || *name == '\0') return fail(__func__, "name is empty");
  if (g->ph == phase::restart_offered) {
    (void)cairn_restart_end(g->c, 0);
    g->ph = phase::none;
  }
  g->wanted = name;
  return SCR_SUCCESS;
}

int SCR_Should_exit(int* flag) {
  SCR_NEED_INIT(__func__);
  if (flag == nullptr) return fail(__func__, "flag is NULL");
  int halt = 0;
  if (g->rank == 0) {
    struct stat sb;
    if (::stat((g->prefix + "/.scr/halt").c_str(), &sb) == 0) halt = 1;
    const char* end = std::getenv("SCR_END_TIME");
    if (end && g->halt_seconds > 0 && std::time(nullptr) + g->halt_seconds >= std::atol(end)) halt = 1;
  }
  *flag = bcast_flag(halt);
  return SCR_SUCCESS;
}

char* SCR_Get_version(void) {
  static char version[] = SCR_VERSION " (cairn drop-in)";
  return version;
}

}  // extern "C"
