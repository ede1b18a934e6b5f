#include "storage/geometry.hpp"

#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/xattr.h>

#include <cerrno>
#include <cstring>
#include <sstream>

namespace cairn::storage {
namespace {

// statfs f_type values (linux/magic.h and the file systems' own headers).
constexpr long kCephMagic = 0x00c36400;
constexpr long kLustreMagic = 0x0bd00bd0;
constexpr long kGpfsMagic = 0x47504653;
constexpr long kNfsMagic = 0x6969;
constexpr long kExt4Magic = 0xef53;
constexpr long kXfsMagic = 0x58465342;
constexpr long kTmpfsMagic = 0x01021994;
constexpr long kFuseMagic = 0x65735546;

// The value of xattr `name` of `path`, or empty with errno set.
std::string get_xattr(const std::string& path, const char* name) {
  char buf[512];
  ssize_t n = ::getxattr(path.c_str(), name, buf, sizeof buf - 1);
  if (n < 0) return {};
  return std::string(buf, static_cast<size_t>(n));
}

// "stripe_unit=4194304 stripe_count=1 object_size=4194304 pool=cephfs_data"
void parse_ceph_layout(const std::string& text, stripe_geometry* g) {
  std::istringstream in(text);
  std::string item;
  while (in >> item) {
    auto eq = item.find('=');
    if (eq == std::string::npos) continue;
    const std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    try {
      if (k == "stripe_unit") g->stripe_unit = std::stoull(v);
      else if (k == "stripe_count") g->stripe_count = static_cast<uint32_t>(std::stoul(v));
      else if (k == "object_size") g->object_size = std::stoull(v);
      else if (k == "pool") g->pool = v;
    } catch (const std::exception&) {
      // a field we cannot read stays at its default
    }
  }
}

std::string parent_of(const std::string& dir) {
  auto pos = dir.find_last_of('/');
  if (pos == std::string::npos) return ".";
  if (pos == 0) return "/";
  return dir.substr(0, pos);
}

}  // namespace

result<stripe_geometry> detect_geometry(const std::string& dir) {
  struct statfs sf {};
  if (::statfs(dir.c_str(), &sf) != 0) {
    if (errno == ENOENT) return status(errc::not_found, dir + ": no such directory");
    return status::from_errno(errno, "statfs " + dir);
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return status::from_errno(errno, "stat " + dir);
  stripe_geometry g;
  g.stripe_unit = static_cast<uint64_t>(st.st_blksize);
  g.source = "st_blksize";
  switch (static_cast<long>(sf.f_type)) {
    case kCephMagic: g.fs = "cephfs"; break;
    case kLustreMagic: g.fs = "lustre"; break;
    case kGpfsMagic: g.fs = "gpfs"; break;
    case kNfsMagic: g.fs = "nfs"; break;
    case kExt4Magic: g.fs = "ext4"; break;
    case kXfsMagic: g.fs = "xfs"; break;
    case kTmpfsMagic: g.fs = "tmpfs"; break;
    case kFuseMagic: g.fs = "fuse"; break;
    default: g.fs = "other"; break;
  }
  // CephFS, also through ceph-fuse (a FUSE file system to statfs): the
  // layout xattrs of the directory or of the nearest ancestor that has one.
  if (g.fs == "cephfs" || g.fs == "fuse") {
    std::string d = dir;
    for (int depth = 0; depth < 4096; ++depth) {
      std::string text = get_xattr(d, "ceph.dir.layout");
      if (!text.empty()) {
        parse_ceph_layout(text, &g);
        g.fs = "cephfs";
        g.source = d == dir ? "ceph.dir.layout of " + d : "ceph.dir.layout of " + d + " (inherited)";
        break;
      }
      // ENODATA: no layout of its own (inherited); anything else: not CephFS.
      if (errno != ENODATA) break;
      struct stat pst {};
      const std::string up = parent_of(d);
      if (up == d || ::stat(up.c_str(), &pst) != 0 || pst.st_dev != st.st_dev) {
        // The file system's root without a layout of its own: the defaults
        // show in a file's layout; st_blksize is CephFS's object size.
        g.fs = "cephfs";
        g.object_size = g.stripe_unit;
        g.source = "st_blksize (no ceph.dir.layout up to the mount point)";
        break;
      }
      d = up;
    }
  }
  if (g.fs == "lustre")
    g.source = "st_blksize (built without liblustreapi: the stripe count is not read; set stripe_count)";
  if (g.stripe_unit == 0) g.stripe_unit = 4096;
  return g;
}

status set_dir_layout(const std::string& dir, uint64_t stripe_unit, uint32_t stripe_count, uint64_t object_size) {
  CAIRN_ASSIGN_OR_RETURN(stripe_geometry g, detect_geometry(dir));
  if (g.fs != "cephfs")
    return status(errc::not_supported, dir + " is on " + g.fs + ", whose layout cairn cannot set (CephFS only; " +
                                           "set the stripes with the file system's own tool, e.g. lfs setstripe)");
  if ((stripe_unit && stripe_unit % 65536) || (object_size && stripe_unit && object_size % stripe_unit))
    return status(errc::invalid_argument, "CephFS layout of " + dir + ": stripe_unit " + std::to_string(stripe_unit) +
                                              " must be a multiple of 65536 and object_size " +
                                              std::to_string(object_size) + " a multiple of stripe_unit");
  auto set = [&](const char* field, uint64_t v) -> status {
    const std::string name = std::string("ceph.dir.layout.") + field, value = std::to_string(v);
    if (::setxattr(dir.c_str(), name.c_str(), value.data(), value.size(), 0) == 0) return {};
    if (errno == EINVAL)
      return status(errc::invalid_argument, "CephFS refused " + name + " = " + value + " on " + dir +
                                                " (object_size must be a multiple of stripe_unit, itself a multiple "
                                                "of 65536)");
    return status::from_errno(errno, "setxattr " + name + " on " + dir);
  };
  // Each change is checked on its own: with both stripe_unit and object_size
  // changing, stripe_unit goes to 64 KiB first, which divides every valid
  // object size, so no intermediate layout is refused.
  if (stripe_unit && object_size) {
    CAIRN_RETURN_IF_ERROR(set("stripe_unit", 65536));
    CAIRN_RETURN_IF_ERROR(set("object_size", object_size));
    CAIRN_RETURN_IF_ERROR(set("stripe_unit", stripe_unit));
  } else if (stripe_unit) {
    CAIRN_RETURN_IF_ERROR(set("stripe_unit", stripe_unit));
  } else if (object_size) {
    CAIRN_RETURN_IF_ERROR(set("object_size", object_size));
  }
  if (stripe_count) CAIRN_RETURN_IF_ERROR(set("stripe_count", stripe_count));
  return {};
}

}  // namespace cairn::storage
