"""Layer 3, in the harness: the sample's read-only root in a new mount namespace.

The host's tree bound read-only (recursively, by the kernel), the box bound
writable, an empty read-only /tmp (other boxes, other users' files are out of
sight; only the sample's own Python environment, when it lives there, is bound
in read-only), a minimal /dev and a /proc of the new PID namespace; the
harness pivots into it and detaches the old root.

Runs inside the sandboxed child only (loaded by path by ``harness.py``):
standard library only, no imports from the package.
"""

import os
import sys

# Layer 3: the read-only root (linux/mount.h, linux/fcntl.h).
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC = 0x2, 0x4, 0x8, 0x1000, 0x4000
MNT_DETACH, AT_FDCWD, AT_RECURSIVE = 2, -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
SYS_MOUNT_SETATTR = 442  # Linux 5.12; new syscalls share one number on every architecture
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41}  # no libc wrapper
STAGING_TMPFS = "size=64k,nr_inodes=16,mode=700"  # holds only the new root's mount point
EMPTY_TMPFS = "size=64k,nr_inodes=64,mode=755"  # the sample's /tmp: the box's path, no more
# The only device nodes the sample can open (every other mount is nodev): root
# in the user namespace is the host's root to the kernel's permission checks,
# so the host's /dev would hand it /dev/kmsg or the disks.
DEVICES = ("null", "zero", "full", "random", "urandom")
DEVICE_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
                "stderr": "/proc/self/fd/2"}


def confine_filesystem(load_libc, box, want_proc):
    """Builds the sample's root in this (new, private) mount namespace and pivots
    into it: the host's tree bound read-only, recursively, by mount_setattr (a
    bind remount would make only the top mount read-only); the box bound
    writable at its own path; an empty read-only tmpfs on /tmp; a /dev of a few
    harmless devices, every other mount nodev; a /proc of the new PID namespace
    where the kernel allows one (want_proc None: try). The old root is
    detached, so no path leads back to the writable host. True when the new
    /proc was mounted. ``load_libc``: ``libc.load_libc``."""
    ctypes, call = load_libc()
    encode = lambda path: None if path is None else os.fsencode(path)

    def mount(source, target, fstype, flags, data=None):
        call("mount", "mount " + target, encode(source), encode(target), encode(fstype), flags,
             encode(data))

    def set_attributes(path, recursive, add, remove=0):
        attributes = (ctypes.c_uint64 * 4)(add, remove, 0, 0)  # struct mount_attr
        call("syscall", "mount_setattr " + path, SYS_MOUNT_SETATTR, AT_FDCWD, encode(path),
             AT_RECURSIVE if recursive else 0, attributes, ctypes.sizeof(attributes))

    box_fd = os.open(box, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    # Staging: a tmpfs over the box (box_fd still reaches the box underneath)
    # holds the new root's mount point, so nothing outside the box is touched.
    mount("tmpfs", box, "tmpfs", MS_NOSUID | MS_NODEV, STAGING_TMPFS)
    root = box + "/root"
    os.mkdir(root)
    mount("/", root, None, MS_BIND | MS_REC)
    if os.path.isdir(root + "/tmp") and not os.path.islink(root + "/tmp"):
        mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, EMPTY_TMPFS)
        # The Python the sample runs with may live under /tmp (a CI checkout's
        # virtual environment): it stays visible, read-only like the rest.
        for path in python_paths_under("/tmp"):
            os.makedirs(root + path, exist_ok=True)
            mount(path, root + path, None, MS_BIND | MS_REC)
    os.makedirs(root + box, exist_ok=True)
    mount("/proc/self/fd/%d" % box_fd, root + box, None, MS_BIND)
    os.close(box_fd)
    devices = minimal_dev(mount, root + "/dev")
    own_proc = False
    if want_proc is not False:
        try:
            mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            own_proc = True
        except OSError:  # e.g. a container that masks parts of its /proc
            if want_proc:
                raise
    set_attributes(root, True, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)
    set_attributes(root + box, False, 0, MOUNT_ATTR_RDONLY)
    for device in devices:
        set_attributes(device, False, 0, MOUNT_ATTR_NODEV)
    os.chdir(root)
    call("syscall", "pivot_root", SYS_PIVOT_ROOT[os.uname().machine], b".", b".")
    call("umount2", "detach the old root", b".", MNT_DETACH)
    os.chdir(box)
    return own_proc


def python_paths_under(directory: str) -> list[str]:
    """The interpreter's installation and environment folders (prefixes, and the
    folder of the executable) that lie under ``directory``, outermost only."""
    inside = sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                   os.path.dirname(sys.executable))
                     if os.path.realpath(p).startswith(directory.rstrip("/") + "/")})
    return [p for i, p in enumerate(inside)
            if not any(p.startswith(q + "/") for q in inside[:i])]


def minimal_dev(mount, dev):
    """A tmpfs on ``dev`` holding binds of DEVICES and the usual links; returns
    the device mount points (their nodev is cleared later). Nothing where the
    host has no /dev directory."""
    if not os.path.isdir(dev) or os.path.islink(dev):
        return []
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NODEV, EMPTY_TMPFS)
    points = []
    for name in DEVICES:
        if os.path.exists("/dev/" + name):
            os.close(os.open(dev + "/" + name, os.O_CREAT | os.O_WRONLY, 0o666))
            mount("/dev/" + name, dev + "/" + name, None, MS_BIND)
            points.append(dev + "/" + name)
    for name, target in DEVICE_LINKS.items():
        os.symlink(target, dev + "/" + name)
    os.mkdir(dev + "/shm")
    return points

