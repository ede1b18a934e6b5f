// Region comparison for the differ of history_diff (history_diff_internal.hpp,
// docs/design/history.md §2-§4): a per-rank region rank by rank (same rank count
// only), a global-layout region by global index over the intersections of the
// two runs' blocks (any partition); structural differences are reported, not
// compared. The counts equal compare_elements() over the raw arrays: trees
// only skip chunks whose exact leaves are equal, or, in mismatch-only mode,
// whose tolerant leaves are equal when tolerant_leaves_prove() allows it.
// Data are read through the two bounded buffers (history_diff_io.cpp).
#include "analytics/history_diff_internal.hpp"

#include <algorithm>

#include "format/shard.hpp"
#include "format/tree.hpp"

namespace cairn::analytics::history_diff_internal {
namespace {

// The read buffers grow to a tree's chunk size up to this, so that chunks read
// can be checked against their leaves; larger chunks are compared unchecked.
constexpr uint64_t kMaxChunkBuffer = uint64_t{64} << 20;

std::string shape_text(const std::vector<uint64_t>& shape) {
  if (shape.empty()) return "scalar";
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s;
}

uint64_t volume(const std::vector<uint64_t>& dims) {
  uint64_t v = 1;
  for (uint64_t d : dims) v *= d;
  return v;
}

// Row-major (storage order) coordinates of a linear index.
std::vector<uint64_t> unravel(uint64_t index, const std::vector<uint64_t>& shape) {
  std::vector<uint64_t> c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    const uint64_t n = shape[d] == 0 ? 1 : shape[d];
    c[d] = index % n;
    index /= n;
  }
  return c;
}

uint64_t ravel(const std::vector<uint64_t>& coords, const std::vector<uint64_t>& shape) {
  uint64_t idx = 0;
  for (size_t d = 0; d < shape.size(); ++d) idx = idx * shape[d] + coords[d];
  return idx;
}

}  // namespace

// ---- per-rank regions --------------------------------------------------------------
void differ::compare_per_rank(int ri, const std::string& region, const std::vector<const format::region_desc*>& da,
                              const std::vector<const format::region_desc*>& db, version_diff& vd) {
  if (da.size() != db.size()) {
    region_diff rd;
    rd.region = region;
    rd.state = region_state::not_comparable;
    set_types(rd, da, db);
    rd.problems.push_back("not comparable: per-rank region and different rank counts (A has " +
                          std::to_string(da.size()) + " ranks, B has " + std::to_string(db.size()) + ")");
    finish_region(vd.version, ri, std::move(rd), vd);
    return;
  }
  for (size_t r = 0; r < da.size(); ++r) {
    shard_src& sa = side_a_.shards[r];
    shard_src& sb = side_b_.shards[r];
    const format::region_desc* a = da[r];
    const format::region_desc* b = db[r];
    if (!a && !b && sa.ok && sb.ok) continue;  // this rank has no such region in either run
    region_diff rd;
    rd.region = region;
    rd.rank = static_cast<int64_t>(r);
    if (a) rd.type_a = a->type, rd.shape_a = block_shape(*a);
    if (b) rd.type_b = b->type, rd.shape_b = block_shape(*b);
    if (!sa.ok || !sb.ok) {
      rd.state = region_state::unreadable;
      rd.problems.push_back(std::string("shard of rank ") + std::to_string(r) + " unreadable in run " +
                            (!sa.ok ? "A" : "B"));
    } else if (!a || !b) {
      rd.state = region_state::structural;
      rd.problems.push_back(std::string("region only in run ") + (a ? "A" : "B") + " on rank " + std::to_string(r));
    } else {
      structural_checks(rd, *a, *b);
      if (rd.problems.empty()) {
        compare_stats st;
        if (compare_blocks(sa, *a, sb, *b, rd, &st, vd)) {
          rd.stats = std::move(st);
          if (rd.stats.first) {
            mismatch_location loc;
            loc.index = rd.stats.first->index;
            if (!a->dims.empty()) loc.coords = unravel(loc.index, a->dims);
            loc.rank_a = loc.rank_b = static_cast<int64_t>(r);
            loc.a = rd.stats.first->a;
            loc.b = rd.stats.first->b;
            rd.first = std::move(loc);
          }
        } else {
          rd.state = region_state::unreadable;
        }
      } else {
        rd.state = region_state::structural;
      }
    }
    finish_region(vd.version, ri, std::move(rd), vd);
  }
}

void differ::structural_checks(region_diff& rd, const format::region_desc& a, const format::region_desc& b) {
  if (a.type != b.type) {
    rd.problems.push_back(std::string("type differs: A ") + format::type_name(a.type) + ", B " +
                          format::type_name(b.type));
  }
  if (block_shape(a) != block_shape(b)) {
    rd.problems.push_back("shape differs: A " + shape_text(block_shape(a)) + ", B " + shape_text(block_shape(b)));
  }
  if ((a.flags & format::kColumnMajor) != (b.flags & format::kColumnMajor)) {
    rd.problems.push_back(std::string("storage order differs: A ") +
                          ((a.flags & format::kColumnMajor) ? "column" : "row") + "-major, B " +
                          ((b.flags & format::kColumnMajor) ? "column" : "row") + "-major");
  }
}

// ---- whole blocks ------------------------------------------------------------------
const format::region_tree* differ::usable_tree(const shard_src& s, const format::region_desc& d) {
  if (!s.tree) return nullptr;
  const format::region_tree* t = s.tree->find(d.name);
  if (!t || t->type != d.type || t->count != d.count) return nullptr;
  return t;
}

// Compares the whole blocks a and b (same type and element count), element i
// with element i, into *st (indices into the block). Uses the trees when
// both are usable with the same chunking. False when data could not be read.
bool differ::compare_blocks(shard_src& sa, const format::region_desc& a, shard_src& sb, const format::region_desc& b,
                            region_diff& rd, compare_stats* st, version_diff& vd) {
  cur_vd_ = &vd;
  const uint64_t n = a.count;
  const uint8_t type = a.type;
  const uint64_t es = format::type_size(type);
  const format::region_tree* ta = usable_tree(sa, a);
  const format::region_tree* tb = usable_tree(sb, b);
  const bool trees = ta && tb && sa.tree->chunk_bytes == sb.tree->chunk_bytes;
  if (trees && ta->exact_root == tb->exact_root && ta->exact.size() == tb->exact.size()) {
    st->exact += n;
    rd.chunks_skipped += ta->exact.size();
    return true;
  }
  bool tolerant = false;
  if (trees && o_.mismatches_only && ta->has_tolerant && tb->has_tolerant && sa.tree->quantum == sb.tree->quantum &&
      ta->tolerant.size() == ta->exact.size() && tb->tolerant.size() == tb->exact.size()) {
    tolerant = proof(sa.tree->quantum).usable;
  }
  if (trees && sa.tree->chunk_bytes > buf_a_.size() && sa.tree->chunk_bytes <= kMaxChunkBuffer) {
    // A whole chunk must fit to be checked against its leaf.
    buf_a_.resize(sa.tree->chunk_bytes);
    buf_b_.resize(sa.tree->chunk_bytes);
  }
  const uint64_t per = trees ? format::elements_per_chunk(sa.tree->chunk_bytes, type) : 0;
  const uint64_t buf_elems = buf_a_.size() / es;
  if (!trees) {
    return read_compare(sa, a, sb, b, 0, n, nullptr, nullptr, 0, rd, st);
  }
  // Runs of consecutive chunks that must be read, coalesced up to the buffer.
  const uint64_t nch = ta->exact.size();
  uint64_t run_first = 0, run_len = 0;
  for (uint64_t c = 0; c <= nch; ++c) {
    bool skip = false;
    if (c < nch) {
      const uint64_t first = c * per;
      const uint64_t cnt = std::min(per, n - first);
      if (ta->exact[c] == tb->exact[c]) {
        st->exact += cnt;
        ++rd.chunks_skipped;
        skip = true;
      } else if (tolerant && ta->tolerant[c] == tb->tolerant[c]) {
        rd.tolerant_within += cnt;
        ++rd.chunks_skipped;
        skip = true;
      }
    }
    const bool flush = c == nch || skip || (run_len > 0 && (run_len + 1) * per > buf_elems);
    if (flush && run_len > 0) {
      const uint64_t e0 = run_first * per, e1 = std::min((run_first + run_len) * per, n);
      if (!read_compare(sa, a, sb, b, e0, e1, ta, tb, per, rd, st)) return false;
      run_len = 0;
    }
    if (c < nch && !skip) {
      if (run_len == 0) run_first = c;
      ++run_len;
    }
  }
  return true;
}

// Reads elements [e0, e1) of blocks a and b in pieces that fit the buffers
// and compares them. With leaves (ta, tb, per), pieces are whole chunks and
// every chunk read is checked against its exact leaf.
bool differ::read_compare(shard_src& sa, const format::region_desc& a, shard_src& sb, const format::region_desc& b,
                          uint64_t e0, uint64_t e1, const format::region_tree* ta, const format::region_tree* tb,
                          uint64_t per, region_diff& rd, compare_stats* st) {
  const uint8_t type = a.type;
  const uint64_t es = format::type_size(type);
  uint64_t piece = buf_a_.size() / es;
  const bool check = ta && per <= piece;
  if (check) piece = piece / per * per;
  for (uint64_t e = e0; e < e1;) {
    const uint64_t cnt = std::min(piece, e1 - e);
    if (!read_side(sa, "A", a, e, cnt, ta, check ? per : 0, buf_a_.data())) return false;
    if (!read_side(sb, "B", b, e, cnt, tb, check ? per : 0, buf_b_.data())) return false;
    compare_into(st, buf_a_.data(), buf_b_.data(), cnt, type, o_.tol, e);
    rd.chunks_read += check ? (cnt + per - 1) / per : 1;
    e += cnt;
  }
  return true;
}

const tolerant_proof& differ::proof(double quantum) {
  auto it = proofs_.find(quantum);
  if (it == proofs_.end()) it = proofs_.emplace(quantum, tolerant_leaves_prove(quantum, o_.tol)).first;
  if (!proof_noted_ || (!it->second.usable && res_.tolerant.usable)) {
    res_.tolerant = it->second;
    proof_noted_ = true;
  }
  return it->second;
}

// ---- global-layout regions ---------------------------------------------------------
void differ::compare_global(int ri, const std::string& region, const std::vector<const format::region_desc*>& da,
                            const std::vector<const format::region_desc*>& db, bool unreadable, version_diff& vd) {
  cur_vd_ = &vd;
  region_diff rd;
  rd.region = region;
  rd.global = true;
  set_types(rd, da, db);
  if (unreadable) {
    rd.state = region_state::unreadable;
    rd.problems.push_back("a shard of run " + std::string(side_unreadable(side_a_) ? "A" : "B") +
                          " is unreadable: its blocks are unknown");
    finish_region(vd.version, ri, std::move(rd), vd);
    return;
  }
  std::vector<block> ba, bb;
  auto collect = [&](run_side& side, const std::vector<const format::region_desc*>& d, std::vector<block>* out) {
    for (size_t r = 0; r < d.size(); ++r) {
      if (!d[r]) continue;
      block b;
      b.src = &side.shards[r];
      b.desc = d[r];
      b.start = d[r]->start;
      b.dims = d[r]->dims;
      out->push_back(std::move(b));
    }
  };
  collect(side_a_, da, &ba);
  collect(side_b_, db, &bb);
  // Everything must agree: type, global shape, storage order, in each run and across.
  auto agree = [&](const char* label, const std::vector<block>& bl) {
    for (auto& b : bl) {
      const auto& f = *bl.front().desc;
      if (b.desc->type != f.type || b.desc->global != f.global ||
          (b.desc->flags & format::kColumnMajor) != (f.flags & format::kColumnMajor)) {
        rd.problems.push_back(std::string("the ranks of run ") + label + " disagree on type, global shape or " +
                              "storage order (rank " + std::to_string(bl.front().src->rank) + ": " +
                              format::type_name(f.type) + " " + shape_text(f.global) + ", rank " +
                              std::to_string(b.src->rank) + ": " + format::type_name(b.desc->type) + " " +
                              shape_text(b.desc->global) + ")");
        return false;
      }
    }
    return true;
  };
  // Each side is checked even when the other failed: both sides' problems are reported.
  const bool a_agrees = agree("A", ba), b_agrees = agree("B", bb);
  bool ok = a_agrees && b_agrees;
  if (ok) {
    structural_checks_global(rd, *ba.front().desc, *bb.front().desc);
    ok = rd.problems.empty();
  }
  if (ok) {
    const bool a_apart = no_overlap("A", ba, rd), b_apart = no_overlap("B", bb, rd);
    ok = a_apart && b_apart;
  }
  if (!ok) {
    rd.state = region_state::structural;
    finish_region(vd.version, ri, std::move(rd), vd);
    return;
  }
  const std::vector<uint64_t>& global = ba.front().desc->global;
  uint64_t vol_a = 0, vol_b = 0, matched = 0;
  for (auto& b : ba) vol_a += volume(b.dims);
  for (auto& b : bb) vol_b += volume(b.dims);
  bool readable = true;
  for (auto& x : ba) {
    for (auto& y : bb) {
      if (!readable) break;
      if (volume(x.dims) == 0 || volume(y.dims) == 0) continue;
      compare_stats part;
      if (x.start == y.start && x.dims == y.dims) {
        // Same block in both runs: the trees apply.
        readable = compare_blocks(*x.src, *x.desc, *y.src, *y.desc, rd, &part, vd);
        if (part.first) {
          std::vector<uint64_t> c = unravel(part.first->index, x.dims);
          for (size_t d = 0; d < c.size(); ++d) c[d] += x.start[d];
          part.first->index = ravel(c, global);
        }
        matched += volume(x.dims);
      } else {
        std::vector<uint64_t> lo(global.size()), hi(global.size());
        bool empty = false;
        for (size_t d = 0; d < global.size(); ++d) {
          lo[d] = std::max(x.start[d], y.start[d]);
          hi[d] = std::min(x.start[d] + x.dims[d], y.start[d] + y.dims[d]);
          if (lo[d] >= hi[d]) empty = true;
        }
        if (empty) continue;
        std::vector<uint64_t> ext(global.size());
        for (size_t d = 0; d < global.size(); ++d) ext[d] = hi[d] - lo[d];
        matched += volume(ext);
        readable = compare_box(x, y, lo, hi, global, rd, &part);
      }
      if (part.first && (!rd.stats.first || part.first->index < rd.stats.first->index)) {
        mismatch_location loc;
        loc.index = part.first->index;
        loc.coords = unravel(loc.index, global);
        loc.rank_a = x.src->rank;
        loc.rank_b = y.src->rank;
        loc.a = part.first->a;
        loc.b = part.first->b;
        rd.first = std::move(loc);
      }
      rd.stats.merge(part);
    }
  }
  if (!readable) {
    rd.state = region_state::unreadable;
    rd.problems.push_back("data could not be read (see the version's problems)");
  }
  rd.unmatched_a = vol_a - matched;
  rd.unmatched_b = vol_b - matched;
  if (rd.unmatched_a > 0) {
    rd.problems.push_back(std::to_string(rd.unmatched_a) +
                          " elements of the global array are held by run A's blocks but by no block of run B "
                          "(cannot be matched)");
  }
  if (rd.unmatched_b > 0) {
    rd.problems.push_back(std::to_string(rd.unmatched_b) +
                          " elements of the global array are held by run B's blocks but by no block of run A "
                          "(cannot be matched)");
  }
  finish_region(vd.version, ri, std::move(rd), vd);
}

bool differ::side_unreadable(const run_side& s) {
  for (auto& sh : s.shards)
    if (!sh.ok) return true;
  return false;
}

void differ::structural_checks_global(region_diff& rd, const format::region_desc& a, const format::region_desc& b) {
  if (a.type != b.type) {
    rd.problems.push_back(std::string("type differs: A ") + format::type_name(a.type) + ", B " +
                          format::type_name(b.type));
  }
  if (a.global != b.global) {
    rd.problems.push_back("global shape differs: A " + shape_text(a.global) + ", B " + shape_text(b.global));
  }
  if ((a.flags & format::kColumnMajor) != (b.flags & format::kColumnMajor)) {
    rd.problems.push_back(std::string("storage order differs: A ") +
                          ((a.flags & format::kColumnMajor) ? "column" : "row") + "-major, B " +
                          ((b.flags & format::kColumnMajor) ? "column" : "row") + "-major");
  }
}

bool differ::no_overlap(const char* label, const std::vector<block>& bl, region_diff& rd) {
  for (size_t i = 0; i < bl.size(); ++i) {
    for (size_t j = i + 1; j < bl.size(); ++j) {
      bool overlap = volume(bl[i].dims) > 0 && volume(bl[j].dims) > 0;
      for (size_t d = 0; d < bl[i].dims.size() && overlap; ++d) {
        overlap = std::max(bl[i].start[d], bl[j].start[d]) <
                  std::min(bl[i].start[d] + bl[i].dims[d], bl[j].start[d] + bl[j].dims[d]);
      }
      if (overlap) {
        rd.problems.push_back(std::string("blocks of ranks ") + std::to_string(bl[i].src->rank) + " and " +
                              std::to_string(bl[j].src->rank) + " of run " + label +
                              " overlap: elements cannot be assigned to one block");
        return false;
      }
    }
  }
  return true;
}

// Compares the box [lo, hi) (global coordinates) held by block x of run A
// and block y of run B, row by row along the last dimension, reading rows in
// batches. Indices in *st are global.
bool differ::compare_box(const block& x, const block& y, const std::vector<uint64_t>& lo,
                         const std::vector<uint64_t>& hi, const std::vector<uint64_t>& global, region_diff& rd,
                         compare_stats* st) {
  const size_t nd = global.size();
  const uint8_t type = x.desc->type;
  const uint64_t es = format::type_size(type);
  const uint64_t cap = buf_a_.size() / es;
  const uint64_t len = hi[nd - 1] - lo[nd - 1];
  std::vector<row> batch;
  uint64_t useful = 0;
  auto flush = [&]() -> bool {
    if (batch.empty()) return true;
    std::vector<uint64_t> pos_a(batch.size()), pos_b(batch.size());
    if (!gather(*x.src, "A", *x.desc, batch, true, useful, buf_a_.data(), &pos_a)) return false;
    if (!gather(*y.src, "B", *y.desc, batch, false, useful, buf_b_.data(), &pos_b)) return false;
    for (size_t i = 0; i < batch.size(); ++i) {
      compare_into(st, buf_a_.data() + pos_a[i] * es, buf_b_.data() + pos_b[i] * es, batch[i].len, type, o_.tol,
                   batch[i].g);
    }
    ++rd.chunks_read;
    batch.clear();
    useful = 0;
    return true;
  };
  std::vector<uint64_t> c(lo);  // current row's coordinates (last one = lo)
  for (;;) {
    const uint64_t a_off = ravel_local(c, x.start, x.dims), b_off = ravel_local(c, y.start, y.dims);
    const uint64_t g = ravel(c, global);
    // A row longer than the buffer goes in pieces.
    for (uint64_t done = 0; done < len;) {
      const uint64_t n = std::min(len - done, cap);
      if (useful + n > cap && !flush()) return false;
      batch.push_back(row{a_off + done, b_off + done, g + done, n});
      useful += n;
      done += n;
    }
    // Next row: increment the coordinates before the last dimension.
    size_t d = nd - 1;
    while (d > 0) {
      --d;
      if (++c[d] < hi[d]) break;
      c[d] = lo[d];
      if (d == 0) return flush();
    }
    if (nd == 1) return flush();
  }
}

uint64_t differ::ravel_local(const std::vector<uint64_t>& c, const std::vector<uint64_t>& start,
                             const std::vector<uint64_t>& dims) {
  uint64_t idx = 0;
  for (size_t d = 0; d < dims.size(); ++d) idx = idx * dims[d] + (c[d] - start[d]);
  return idx;
}

// Reads the rows of a batch from one block into buf: one read of their span
// when it fits the buffer and is at least a quarter useful, else a read per
// row, packed. pos[i] receives row i's element position in buf.
bool differ::gather(shard_src& s, const char* label, const format::region_desc& d, const std::vector<row>& batch,
                    bool side_a, uint64_t useful, std::byte* buf, std::vector<uint64_t>* pos) {
  const uint64_t es = format::type_size(d.type);
  const uint64_t cap = buf_a_.size() / es;
  uint64_t lo = UINT64_MAX, hi = 0;
  for (auto& r : batch) {
    const uint64_t off = side_a ? r.a_off : r.b_off;
    lo = std::min(lo, off);
    hi = std::max(hi, off + r.len);
  }
  if (hi - lo <= cap && useful * 4 >= hi - lo) {
    if (!read(s, label, d.offset + lo * es, buf, static_cast<size_t>((hi - lo) * es))) return false;
    for (size_t i = 0; i < batch.size(); ++i) (*pos)[i] = (side_a ? batch[i].a_off : batch[i].b_off) - lo;
    return true;
  }
  uint64_t at = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const uint64_t off = side_a ? batch[i].a_off : batch[i].b_off;
    if (!read(s, label, d.offset + off * es, buf + at * es, static_cast<size_t>(batch[i].len * es))) return false;
    (*pos)[i] = at;
    at += batch[i].len;
  }
  return true;
}

}  // namespace cairn::analytics::history_diff_internal
