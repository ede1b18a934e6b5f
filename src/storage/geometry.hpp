// The stripe geometry of a directory on a (parallel) file system: what the
// aggregated flush aligns its extents to and how many files it writes
// (docs/design/aggregation.md). Detected, never assumed:
//   CephFS (kernel client or ceph-fuse): the ceph.dir.layout xattrs of the
//     directory or its nearest ancestor that has one (stripe_unit,
//     stripe_count, object_size);
//   Lustre: the LL_IOC_LOV_GETSTRIPE ioctl needs liblustreapi, which this
//     build does not use: the file system is named, the geometry comes from
//     st_blksize (Lustre reports the stripe size there) with a note;
//   anything else (GPFS, NFS, ext4, xfs, tmpfs): st_blksize, one target.
// The layout of new files is set where the file system allows it (CephFS:
// the directory's xattrs, before the first write of a file in it).
#ifndef CAIRN_STORAGE_GEOMETRY_HPP
#define CAIRN_STORAGE_GEOMETRY_HPP

#include <cstdint>
#include <string>

#include "cairn/status.hpp"

namespace cairn::storage {

struct stripe_geometry {
  std::string fs;             // "cephfs", "lustre", "gpfs", "nfs", "ext4", "xfs", "tmpfs", "fuse", "other"
  uint64_t stripe_unit = 0;   // bytes a target holds contiguously; the alignment of extents
  uint32_t stripe_count = 1;  // targets a file is spread over
  uint64_t object_size = 0;   // CephFS: bytes of one object (0 elsewhere)
  std::string pool;           // CephFS: the data pool (empty elsewhere)
  std::string source;         // where the numbers come from, for `cairn show`-like output and logs
};

// The geometry new files in `dir` get. not_found when dir does not exist,
// io_error when it cannot be read.
result<stripe_geometry> detect_geometry(const std::string& dir);

// Sets the layout files created in `dir` afterwards get (CephFS only):
// stripe_unit (a multiple of 64 KiB), stripe_count, object_size (a multiple
// of stripe_unit); 0 leaves a field as it is. not_supported on another file
// system, invalid_argument for a layout the file system refuses (with its
// rule), io_error otherwise.
status set_dir_layout(const std::string& dir, uint64_t stripe_unit, uint32_t stripe_count, uint64_t object_size);

}  // namespace cairn::storage

#endif
