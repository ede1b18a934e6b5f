#!/usr/bin/env python3
"""lossy_fs: a FUSE pass-through file system that loses what a power loss may
lose, for the power-loss campaign (test_power_loss.py).

    lossy_fs.py BACKING MOUNTPOINT [--crash-on-exit] [--seed N]

Every operation goes through to BACKING at once (so the processes that use
MOUNTPOINT see a normal file system), and what is not durable yet by the rules
of POSIX is journaled beside it: file data written since the file's last
fsync/fdatasync, and directory entries created, renamed or removed since their
directory's last fsync. With --crash-on-exit, unmounting (fusermount3 -u) is a
power loss: unsynced file data reads back as garbage and files fall back to
their size at their last sync; unsynced entry changes are undone, newest
first (a created file or directory vanishes, a rename goes back, a removed
file returns), each one only with probability 1/2 when --seed is given (the
kernel may have written some back, in any order). Then the process exits and
BACKING holds what the disk would. Removed files and files renamed over are
kept as hard links in BACKING/.lossy-backup until then.

The same model as src/storage/crash_env.cpp, under real processes.
"""
import argparse
import errno
import os
import random
import shutil
import sys
import threading

import mfusepy as fuse


class Lossy(fuse.Operations):
    use_ns = True  # utimens gets nanoseconds

    def __init__(self, root):
        self.root = os.path.realpath(root)
        self.backup = os.path.join(self.root, ".lossy-backup")
        shutil.rmtree(self.backup, ignore_errors=True)
        os.mkdir(self.backup)
        self.mu = threading.Lock()
        self.nbackup = 0
        self.files = {}    # real path -> [durable_size, [(start, end) written since the last sync]]
        self.journal = []  # (kind, dir, path, frm, backup), oldest first
        self.fd_path = {}  # fh -> real path (renames update it)
        self.stats = {"writes": 0, "syncs": 0, "dir_syncs": 0}

    # ---- helpers ----------------------------------------------------------
    def real(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def _backup_of(self, real):
        self.nbackup += 1
        b = os.path.join(self.backup, str(self.nbackup))
        os.link(real, b)
        return b

    def _created(self, real, kind):
        self.journal.append((kind, os.path.dirname(real), real, None, None))

    # ---- metadata ---------------------------------------------------------
    def getattr(self, path, fh=None):
        st = os.lstat(self.real(path))
        return {k: getattr(st, k) for k in ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink",
                                            "st_size", "st_uid", "st_ino")}

    def access(self, path, amode):
        if not os.access(self.real(path), amode):
            raise fuse.FuseOSError(errno.EACCES)
        return 0

    def readdir(self, path, fh):
        names = os.listdir(self.real(path))
        if path == "/":
            names = [n for n in names if n != ".lossy-backup"]
        return [".", ".."] + names

    def statfs(self, path):
        st = os.statvfs(self.real(path))
        return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
                                            "f_files", "f_flag", "f_frsize", "f_namemax")}

    def chmod(self, path, mode):
        os.chmod(self.real(path), mode)
        return 0

    def chown(self, path, uid, gid):
        os.chown(self.real(path), uid, gid)
        return 0

    def utimens(self, path, times=None):
        os.utime(self.real(path), ns=times) if times else os.utime(self.real(path))
        return 0

    def mkdir(self, path, mode):
        real = self.real(path)
        with self.mu:
            os.mkdir(real, mode)
            self._created(real, "dir")
        return 0

    def rmdir(self, path):
        real = self.real(path)
        with self.mu:
            os.rmdir(real)
            self.journal.append(("rmdir", os.path.dirname(real), real, None, None))
        return 0

    def unlink(self, path):
        real = self.real(path)
        with self.mu:
            b = self._backup_of(real)
            os.unlink(real)
            self.journal.append(("unlink", os.path.dirname(real), real, None, b))
        return 0

    def rename(self, old, new):
        src, dst = self.real(old), self.real(new)
        with self.mu:
            b = self._backup_of(dst) if os.path.lexists(dst) and not os.path.isdir(dst) else None
            os.rename(src, dst)
            self.journal.append(("rename", os.path.dirname(dst), dst, src, b))
            if src in self.files:
                self.files[dst] = self.files.pop(src)
            for fh, p in self.fd_path.items():
                if p == src:
                    self.fd_path[fh] = dst
        return 0

    def link(self, target, source):
        real = self.real(target)
        with self.mu:
            os.link(self.real(source), real)
            self._created(real, "file")
        return 0

    def truncate(self, path, length, fh=None):
        real = self.real(path)
        with self.mu:
            os.truncate(real, length)
            st = self.files.setdefault(real, [os.path.getsize(real), []])
            st[1].append((min(length, st[0]), max(length, st[0])))
        return 0

    # ---- files ------------------------------------------------------------
    def create(self, path, mode, fi=None):
        real = self.real(path)
        with self.mu:
            existed = os.path.lexists(real)
            fd = os.open(real, os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)
            if not existed:
                self._created(real, "file")
                self.files[real] = [0, []]
            else:
                st = self.files.setdefault(real, [os.path.getsize(real), []])
                st[1].append((0, st[0]))
            self.fd_path[fd] = real
        return fd

    def open(self, path, flags):
        real = self.real(path)
        with self.mu:
            fd = os.open(real, flags & ~os.O_DIRECT)
            self.fd_path[fd] = real
            if flags & os.O_TRUNC:
                st = self.files.setdefault(real, [0, []])
                st[1].append((0, st[0]))
        return fd

    def read(self, path, size, offset, fh):
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        with self.mu:
            real = self.fd_path[fh]
            st = self.files.setdefault(real, [os.fstat(fh).st_size, []])  # untouched so far: all of it durable
            n = os.pwrite(fh, data, offset)
            st[1].append((offset, offset + n))
            self.stats["writes"] += 1
        return n

    def fsync(self, path, datasync, fh):
        with self.mu:
            os.fsync(fh)
            real = self.fd_path[fh]
            self.files[real] = [os.fstat(fh).st_size, []]
            self.stats["syncs"] += 1
        return 0

    def fsyncdir(self, path, datasync, fh):
        real = self.real(path).rstrip("/") or "/"
        with self.mu:
            self.journal = [j for j in self.journal if j[1] != real]
            self.stats["dir_syncs"] += 1
        return 0

    def flush(self, path, fh):
        return 0

    def release(self, path, fh):
        with self.mu:
            self.fd_path.pop(fh, None)
            os.close(fh)
        return 0

    # ---- the power loss ---------------------------------------------------
    def crash(self, seed):
        rng = random.Random(seed) if seed is not None else None
        lost_bytes = 0
        for real, (durable, ranges) in self.files.items():
            if not ranges or not os.path.lexists(real):
                continue
            size = os.path.getsize(real)
            with open(real, "r+b") as f:
                for a, b in ranges:
                    end = min(b, durable, size)
                    if a < end:
                        f.seek(a)
                        f.write(b"\xee" * (end - a))
                        lost_bytes += end - a
                if any(b > durable for _, b in ranges) and size > durable:
                    f.truncate(durable)
                    lost_bytes += size - durable
        undone = 0
        for kind, d, path, frm, backup in reversed(self.journal):
            if rng is not None and rng.random() < 0.5:
                continue
            if not os.path.isdir(d):
                continue  # its directory's removal reached the disk
            undone += 1
            if kind == "file":
                if os.path.lexists(path):
                    os.unlink(path)
            elif kind == "dir":
                shutil.rmtree(path, ignore_errors=True)
            elif kind == "rename":
                if os.path.lexists(path):
                    os.rename(path, frm)
                if backup:
                    os.link(backup, path)
            elif kind == "unlink":
                if not os.path.lexists(path):
                    os.link(backup, path)
            elif kind == "rmdir":
                os.makedirs(path, exist_ok=True)
        shutil.rmtree(self.backup, ignore_errors=True)
        print(f"lossy_fs: power loss: {lost_bytes} unsynced bytes lost, {undone} of {len(self.journal)} unsynced "
              f"entry changes undone ({self.stats['writes']} writes, {self.stats['syncs']} file syncs, "
              f"{self.stats['dir_syncs']} directory syncs seen)", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("backing")
    ap.add_argument("mountpoint")
    ap.add_argument("--crash-on-exit", action="store_true")
    ap.add_argument("--seed", type=int)
    a = ap.parse_args()
    ops = Lossy(a.backing)
    fuse.FUSE(ops, a.mountpoint, foreground=True, nothreads=False)
    if a.crash_on_exit:
        ops.crash(a.seed)
    else:
        shutil.rmtree(ops.backup, ignore_errors=True)


if __name__ == "__main__":
    main()
