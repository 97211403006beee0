"""Run untrusted generated programs (HumanEval pass@1) in a sandbox.

pass@1 executes code a language model wrote. It is usually harmless, but it can
be wrong in destructive ways (``shutil.rmtree``, an endless loop, a fork), so
every sample runs inside layers that each catch what the others miss:

1. A fresh ``python -I`` subprocess per sample, in a new session, with a new
   temporary directory (the box) as its cwd, HOME and TMPDIR, deleted
   afterwards. Its process group is SIGKILLed when it ends or overruns.
2. Kernel resource limits (``setrlimit`` before exec): CPU seconds, address
   space, file size, no core dumps, and a process budget. Root is exempt from
   RLIMIT_NPROC, which is why layers 3 and 5 also stop and reap processes.
3. Where unprivileged user namespaces work (probed once), new user, mount,
   network and PID namespaces. The harness builds a new root in the mount
   namespace: the host's tree bound read-only (recursively, by the kernel),
   the box bound writable, an empty read-only /tmp (other boxes, other users'
   files are out of sight; only the sample's own Python environment, when it
   lives there, is bound in read-only) and a /proc of the new PID namespace; it pivots
   into it and detaches the old root. The sample then drops every capability
   (no_new_privs, locked securebits, an empty bounding set), so it cannot
   mount, remount or unmount its way out. No network but a downed loopback,
   and every process the sample starts dies with the namespace.
4. Where the kernel offers Landlock, the sample also confines itself with it:
   creating, removing, renaming, writing or truncating paths is refused
   outside the box, as are TCP and (ABI 6+) signals to processes outside it.
   Without namespaces this is the only kernel layer over the filesystem; it
   does not cover chmod, chown, utime or xattrs, so it is reported as partial.
5. An audit hook (``sys.addaudithook``; it cannot be removed) installed in the
   child before the sample runs. It refuses sockets, ctypes, starting programs
   or processes, signalling processes, raising limits, the introspection that
   could reach the hook's own state, and writes, renames, deletions or mode
   changes of paths outside the sandbox directory. It is a deny-list of Python
   functions: a syscall without an audit event (``os.mkfifo``, ``os.mknod``)
   passes it, which is why layers 3 and 4 exist.

``isolation_level()`` says which of these this machine has, as measured from
inside a probe sample; ``SPECDEC_SANDBOX_REQUIRE_KERNEL=1`` (or
``require_kernel_isolation=True``) refuses to score without layer 3. The
sample runs as module ``__sample__``, not ``__main__``, as in the reference
HumanEval harness: a completion's ``if __name__ == "__main__":`` demo does not
run. This guards against accidents and hostility; it is not a boundary against
code that exploits the kernel itself.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings

from specdec_jax.runtime.progress import tqdm

MIB = 1024 * 1024
DETAIL_CHARS = 500  # how much of the sample's stderr an Outcome keeps
STDOUT_TAIL_BYTES = 4096  # where the harness's pass token is looked for
SANDBOX_PREFIX = "specdec_sandbox_"
SAMPLE_FILE = "sample.py"
TMP_SUBDIR = "tmp"
# unshare's flags: the full set (layer 3), then the set without a mount
# namespace that is tried where the filesystem layer cannot be built.
NAMESPACE_FLAGS = ("--user", "--map-root-user", "--mount", "--net", "--pid", "--ipc", "--uts",
                   "--fork", "--kill-child")
NAMESPACE_FLAGS_WITHOUT_MOUNT = tuple(f for f in NAMESPACE_FLAGS if f != "--mount")
NAMESPACE_KINDS = ("user", "mount", "net", "pid", "ipc", "uts")
PROBE_TIMEOUT_S = 10.0
# A sample's view of /proc/self/mountinfo, capabilities and /proc, printed as
# one JSON line: the isolation level is what a sample measures, not what the
# harness meant to build.
PROBE_PROGRAM = r"""
import json, os, re
def unescape(field):
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)
with open("/proc/self/mountinfo") as f:
    fields = [line.split() for line in f]
writable = sorted(unescape(x[4]) for x in fields if "ro" not in x[5].split(","))
with open("/proc/self/status") as f:
    caps = [int(line.split()[1], 16) for line in f if line.startswith("CapEff:")][0]
print(json.dumps({"writable_mounts": writable, "box": os.getcwd(), "capabilities": caps,
                  "own_proc": os.readlink("/proc/self") == str(os.getpid())}))
"""
REQUIRE_KERNEL_ENV = "SPECDEC_SANDBOX_REQUIRE_KERNEL"
KERNEL_LEVEL_PREFIX = "kernel:"
POLL_MIN_S, POLL_MAX_S = 0.001, 0.05  # back-off while waiting for a process
SUPERVISOR_POLL_S = 0.01  # how often the harness checks on the sample
# The harness enforces wall_s itself (it can kill a sample that left the
# process group); the parent kills the group this much later as a backstop.
BACKSTOP_GRACE_S = 2.0
REAP_TIMEOUT_S = 5.0  # how long killed processes get to disappear
# The harness's exit statuses. They avoid 1, which Python or unshare return
# when they themselves fail (scored "error"). A signal N is reported as BASE + N.
FAILED_EXIT, RESOURCE_EXIT, TIMEOUT_EXIT, HARNESS_EXIT = 10, 11, 12, 13
SIGNAL_EXIT_BASE = 128
HUMANEVAL_KEYS = ("prompt", "test", "entry_point")

# Runs in the child as ``python -I -c _HARNESS`` and reads its config from
# stdin. Inside the namespaces it first builds the read-only root (layer 3),
# then forks the sample (so the sample is never PID 1 of a namespace, which
# the kernel spares SIGXCPU and the like) and supervises it: exit status, wall
# clock. The sample process drops its capabilities, applies Landlock, installs
# the audit hook, then runs the program; only a program that runs to its end
# gets the pass token printed, so os._exit(0) or sys.exit(0) halfway through
# is not a pass.
_HARNESS = f"""
FAILED_EXIT, RESOURCE_EXIT, TIMEOUT_EXIT, HARNESS_EXIT = {FAILED_EXIT}, {RESOURCE_EXIT}, \
{TIMEOUT_EXIT}, {HARNESS_EXIT}
SIGNAL_EXIT_BASE, POLL_S = {SIGNAL_EXIT_BASE}, {SUPERVISOR_POLL_S}
""" + r'''
import errno, json, os, signal, stat, struct, sys, time, types

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
BLOCKED = frozenset({
    "os.fork", "os.forkpty", "os.system", "subprocess.Popen", "pty.spawn", "os.kill",
    "os.killpg", "signal.pthread_kill", "resource.setrlimit", "resource.prlimit",
    "cpython.PyInterpreterState_New", "sys.settrace", "sys.setprofile", "sys._current_frames",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sqlite3.enable_load_extension"})
BLOCKED_PREFIXES = ("socket.", "ctypes.", "os.exec", "os.spawn", "os.posix_spawn")
BLOCKED_IMPORTS = frozenset({"_ctypes", "_posixsubprocess", "_xxsubinterpreters", "_testcapi",
                             "_testinternalcapi", "_dbm", "_gdbm"})
# Attribute reads/writes that would reach the hook's frame or rewrite code.
BLOCKED_ATTRIBUTES = frozenset({("object.__getattr__", "tb_frame"),
                                ("object.__setattr__", "__code__")})
# event -> ((index of a path argument, index of its dir_fd argument or None), ...)
PATH_EVENTS = {
    "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),),
    "os.rename": ((0, 2), (1, 3)), "os.link": ((0, 2), (1, 3)), "os.symlink": ((1, 2),),
    "os.chmod": ((0, 2),), "os.chown": ((0, 3),), "os.utime": ((0, 3),),
    "os.truncate": ((0, None),), "os.setxattr": ((0, None),), "os.removexattr": ((0, None),),
    "shutil.rmtree": ((0, 1),), "shutil.copyfile": ((1, None),), "shutil.move": ((0, None),
    (1, None)), "shutil.copytree": ((1, None),), "sqlite3.connect": ((0, None),)}
MAX_SYMLINKS = 40

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
# Capabilities (linux/prctl.h, linux/securebits.h, linux/capability.h).
PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 24, 28, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
# NOROOT, NO_SETUID_FIXUP and KEEP_CAPS, locked: uid 0 regains nothing on exec.
LOCKED_SECUREBITS = 0x01 | 0x02 | 0x04 | 0x08 | 0x20
CAPABILITY_VERSION_3 = 0x20080522
# Layer 4: Landlock (linux/landlock.h); the numbers are the same on every architecture.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION, LANDLOCK_RULE_PATH_BENEATH = 1, 1
LANDLOCK_WRITE_FILE, LANDLOCK_REFER, LANDLOCK_TRUNCATE = 1 << 1, 1 << 13, 1 << 14
# write_file, remove_dir, remove_file, make_char/dir/reg/sock/fifo/block/sym (ABI 1)
LANDLOCK_CHANGES = LANDLOCK_WRITE_FILE | sum(1 << bit for bit in range(4, 13))
LANDLOCK_NET_TCP = 0x1 | 0x2  # bind, connect (ABI 4); no rule allows any port
LANDLOCK_SCOPES = 0x1 | 0x2  # abstract unix sockets, signals outside the domain (ABI 6)
# Seccomp: syscalls the namespaces do not fence. socket() (a unix socket on the
# read-only host, e.g. a daemon's, still connects), keyrings (per user, not per
# namespace), io_uring (it would bypass this filter). Refused with EPERM, as is
# every syscall of another ABI (x32, i386) that could name them differently.
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
BPF_LOAD_WORD, BPF_JUMP_EQUAL, BPF_JUMP_GREATER_EQUAL, BPF_RETURN = 0x20, 0x15, 0x35, 0x06
SECCOMP_ARCH_OFFSET, SECCOMP_NR_OFFSET, X32_SYSCALL_BIT = 4, 0, 0x40000000
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# socket, add_key, request_key, keyctl, io_uring_setup
DENIED_SYSCALLS = {"x86_64": (41, 248, 249, 250, 425), "aarch64": (198, 217, 218, 219, 425)}


def load_libc():
    import ctypes  # only where a kernel layer is set up; the sample never gets it (hide_ctypes)
    libc = ctypes.CDLL(None, use_errno=True)

    def call(name, what, *args):
        """libc ``name`` with integer arguments as C longs; OSError when it returns -1."""
        args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
        result = getattr(libc, name)(*args)
        if result == -1:
            number = ctypes.get_errno()
            raise OSError(number, "%s: %s" % (what, os.strerror(number)))
        return result
    return ctypes, call


def confine_filesystem(box, want_proc):
    """Builds the sample's root in this (new, private) mount namespace and pivots
    into it: the host's tree bound read-only, recursively, by mount_setattr (a
    bind remount would make only the top mount read-only); the box bound
    writable at its own path; an empty read-only tmpfs on /tmp; a /dev of a few
    harmless devices, every other mount nodev; a /proc of the new PID namespace
    where the kernel allows one (want_proc None: try). The old root is
    detached, so no path leads back to the writable host. True when the new
    /proc was mounted."""
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


def drop_privileges(ctypes, call):
    """No capabilities, and none to regain: no_new_privs, securebits that deny
    uid 0 its capabilities on exec, an empty bounding set. Root in the user
    namespace could otherwise remount the read-only root writable."""
    call("prctl", "no_new_privs", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    try:  # needs CAP_SETPCAP, which a process without capabilities does not need
        call("prctl", "securebits", PR_SET_SECUREBITS, LOCKED_SECUREBITS, 0, 0, 0)
        capability = 0
        while True:
            call("prctl", "drop from the bounding set", PR_CAPBSET_DROP, capability, 0, 0, 0)
            capability += 1
    except OSError as exc:  # EINVAL past the last capability; EPERM without CAP_SETPCAP
        if exc.errno not in (errno.EINVAL, errno.EPERM):
            raise
    call("prctl", "clear ambient capabilities", PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0)
    call("capset", "capset", header, (ctypes.c_uint32 * 6)())


def landlock(ctypes, call, box):
    """Confines file creation, removal, renaming, writing and truncation to the
    box (and writes to /dev/null), TCP to nothing, signals to this domain.
    Returns the Landlock ABI applied, 0 where the kernel has none."""
    try:
        abi = call("syscall", "landlock", SYS_LANDLOCK_CREATE_RULESET, None, 0,
                   LANDLOCK_CREATE_RULESET_VERSION)
    except OSError:  # ENOSYS, or EOPNOTSUPP: disabled at boot
        return 0
    changes = LANDLOCK_CHANGES | (LANDLOCK_REFER if abi >= 2 else 0) | (
        LANDLOCK_TRUNCATE if abi >= 3 else 0)
    attributes = (ctypes.c_uint64 * 3)(changes, LANDLOCK_NET_TCP if abi >= 4 else 0,
                                       LANDLOCK_SCOPES if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24  # struct landlock_ruleset_attr grew
    ruleset = call("syscall", "landlock ruleset", SYS_LANDLOCK_CREATE_RULESET, attributes, size, 0)
    try:
        for path, access in ((box, changes), ("/dev/null", changes & (
                LANDLOCK_WRITE_FILE | LANDLOCK_TRUNCATE))):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:  # struct landlock_path_beneath_attr, packed
                call("syscall", "landlock rule " + path, SYS_LANDLOCK_ADD_RULE, ruleset,
                     LANDLOCK_RULE_PATH_BENEATH, struct.pack("=Qi", access, fd), 0)
            finally:
                os.close(fd)
        call("syscall", "landlock restrict", SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0)
    finally:
        os.close(ruleset)
    return abi


def seccomp(ctypes, call):
    """Installs the DENIED_SYSCALLS filter (a classic BPF program); needs no_new_privs."""
    machine = os.uname().machine
    arch, denied = AUDIT_ARCH[machine], DENIED_SYSCALLS[machine]
    deny, count = SECCOMP_RET_ERRNO | errno.EPERM, len(DENIED_SYSCALLS[machine])
    # (code, jump if true, jump if false, k); a jump skips that many instructions.
    program = [(BPF_LOAD_WORD, 0, 0, SECCOMP_ARCH_OFFSET), (BPF_JUMP_EQUAL, 1, 0, arch),
               (BPF_RETURN, 0, 0, deny), (BPF_LOAD_WORD, 0, 0, SECCOMP_NR_OFFSET),
               (BPF_JUMP_GREATER_EQUAL, count + 1, 0, X32_SYSCALL_BIT)]
    program += [(BPF_JUMP_EQUAL, count - i, 0, nr) for i, nr in enumerate(denied)]
    program += [(BPF_RETURN, 0, 0, SECCOMP_RET_ALLOW), (BPF_RETURN, 0, 0, deny)]
    code = ctypes.create_string_buffer(b"".join(struct.pack("=HBBI", *op) for op in program))

    class Program(ctypes.Structure):  # struct sock_fprog
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    call("prctl", "seccomp", PR_SET_SECCOMP, SECCOMP_MODE_FILTER,
         ctypes.byref(Program(len(program), ctypes.addressof(code))), 0, 0)


def confine_process(config, box):
    """The sample process's own kernel layers, as the config asks: a True layer
    must be applied, None (the probe) is tried, False is skipped. Returns the
    layers applied: {"landlock_abi": 0 for none, "seccomp": bool}."""
    try:
        ctypes, call = load_libc()
        drop_privileges(ctypes, call)
    except Exception:
        if config["filesystem"] or config["landlock"] or config["seccomp"]:
            raise
        return {"landlock_abi": 0, "seccomp": False}  # dropping privileges was a courtesy
    applied = {"landlock_abi": 0, "seccomp": False}
    for name, apply in (("seccomp", lambda: seccomp(ctypes, call) or True),
                        ("landlock_abi", lambda: landlock(ctypes, call, box))):
        wanted = config["landlock" if name == "landlock_abi" else name]
        if wanted is not False:
            try:
                applied[name] = apply()
            except (OSError, KeyError):  # KeyError: an architecture without numbers here
                if wanted:
                    raise
        if wanted and not applied[name]:
            raise OSError(errno.ENOSYS, "%s, present when probed, is missing now" % name)
    return applied


def hide_ctypes():
    """Forgets the ctypes the harness imported, so the sample's ``import ctypes``
    meets the audit hook's import check again, as it would without the harness."""
    for name in [n for n in sys.modules if n in ("ctypes", "_ctypes") or n.startswith("ctypes.")]:
        del sys.modules[name]


def make_hook(box):
    # Everything the hook uses is bound here, in its closure: the sample may
    # later rebind names in builtins, os, posixpath or this module.
    lstat, readlink, getcwd, fspath, decode = os.lstat, os.readlink, os.getcwd, os.fspath, \
        bytes.decode
    is_instance, error, import_error = isinstance, PermissionError, ImportError
    encoding = sys.getfilesystemencoding()
    blocked, prefixes, imports, attributes = BLOCKED, BLOCKED_PREFIXES, BLOCKED_IMPORTS, \
        BLOCKED_ATTRIBUTES
    path_events, write_flags, max_links = PATH_EVENTS, WRITE_FLAGS, MAX_SYMLINKS
    file_type, symlink_type = stat.S_IFMT(0o177777), stat.S_IFLNK
    inside_prefix = box + "/"

    def realpath(path):  # os.path.realpath, on the functions bound above
        todo, parts, links = path.split("/")[::-1], [], 0
        while todo:
            name = todo.pop()
            if name == "..":
                parts = parts[:-1]
            elif name not in ("", "."):
                here = "/" + "/".join(parts + [name])
                try:
                    is_link = (lstat(here)[0] & file_type) == symlink_type
                except OSError:
                    is_link = False
                if not is_link:
                    parts.append(name)
                    continue
                links += 1
                if links > max_links:
                    return None
                target = readlink(here)
                parts = [] if target.startswith("/") else parts
                todo.extend(target.split("/")[::-1])
        return "/" + "/".join(parts)

    def fsdecode(path):
        path = fspath(path)
        return path if is_instance(path, str) else decode(path, encoding, "surrogateescape")

    def inside(path, dir_fd=None):
        try:  # a file descriptor or a dir_fd is resolved through /proc
            if is_instance(path, int):
                path = readlink("/proc/self/fd/%d" % path)
            path = fsdecode(path)
            if not path.startswith("/"):
                base = getcwd() if dir_fd is None or dir_fd < 0 else readlink(
                    "/proc/self/fd/%d" % dir_fd)
                path = base + "/" + path
            path = realpath(path)
        except Exception:  # whatever cannot be resolved is outside
            return False
        return path is not None and (path == box or path.startswith(inside_prefix))

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            if is_instance(path, int) or not flags & write_flags:
                return
            # os.open (mode None) may carry a dir_fd that the event does not show.
            relative = mode is None and not fsdecode(path).startswith("/")
            if relative or not (inside(path) or fsdecode(path) == "/dev/null"):
                raise error("sandbox: writing %r is not allowed" % (path,))
        elif event == "import":
            if args[0] in imports:
                raise import_error("sandbox: importing %s is not allowed" % args[0])
        elif event in blocked or event.startswith(prefixes):
            raise error("sandbox: %s is not allowed" % event)
        elif event in path_events:
            for path_index, fd_index in path_events[event]:
                if not inside(args[path_index], None if fd_index is None else args[fd_index]):
                    raise error("sandbox: %s%r is not allowed" % (event, args))
        elif event.startswith("object.__") and (event, args[1]) in attributes:
            raise error("sandbox: %s %s is not allowed" % (event, args[1]))
    return hook


def run_sample(config, box, filename, source, own_proc):
    # Bound before the sample runs, which may rebind names in os, sys or builtins.
    exit_now, write, report = os._exit, os.write, sys.__excepthook__  # C: never reads tb_frame
    is_instance, type_of, os_error = isinstance, type, OSError
    try:
        applied = confine_process(config, box)
        hide_ctypes()
        if config["probe"]:
            write(1, (json.dumps(dict(applied, own_proc=own_proc)) + "\n").encode())
    except BaseException as exc:
        report(type_of(exc), exc, exc.__traceback__)
        sys.stderr.flush()
        exit_now(HARNESS_EXIT)
    try:
        code = compile(source, filename, "exec")
        module = types.ModuleType("__sample__")
        sys.modules["__sample__"] = module
        if config["audit_hook"]:
            sys.addaudithook(make_hook(box))
        exec(code, module.__dict__)
        sys.stdout.flush()
    except MemoryError:
        exit_now(RESOURCE_EXIT)  # reporting it may need memory too
    except BaseException as exc:  # SystemExit too: a sample that exits early skipped tests
        try:
            report(type_of(exc), exc, exc.__traceback__)
            sys.stderr.flush()
        finally:
            too_big = is_instance(exc, os_error) and exc.errno == errno.EFBIG
            exit_now(RESOURCE_EXIT if too_big else FAILED_EXIT)
    write(1, ("\n" + config["token"] + "\n").encode())
    exit_now(0)


def supervise(pid, wall_s):
    deadline = time.monotonic() + wall_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            if code < 0:
                os._exit(SIGNAL_EXIT_BASE - code)
            os._exit(code if code in (0, FAILED_EXIT, RESOURCE_EXIT, HARNESS_EXIT) else
                     FAILED_EXIT)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)  # by pid: it may have left the process group
            os._exit(TIMEOUT_EXIT)
        time.sleep(POLL_S)


def main():
    try:
        config = json.loads(sys.stdin.readline())
        sys.stdin.close()
        box = os.path.realpath(config["box"])
        filename = os.path.join(box, config["sample"])
        with open(filename, encoding="utf-8") as f:
            source = f.read()
        own_proc = confine_filesystem(box, config["proc"]) if config["filesystem"] else False
        pid = os.fork()
    except BaseException as exc:
        sys.__excepthook__(type(exc), exc, exc.__traceback__)
        os._exit(HARNESS_EXIT)
    if pid == 0:
        run_sample(config, box, filename, source, own_proc)
    supervise(pid, config["wall_s"])


main()
'''


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-sample limits; a sample that exceeds one is not passed."""

    wall_s: float = 10.0  # wall-clock seconds before the sample is killed
    cpu_s: int = 10  # RLIMIT_CPU: CPU seconds (SIGKILL when reached)
    memory_mb: int = 1024  # RLIMIT_AS: address space per process
    # Processes/threads the sample may add to those its user already runs
    # (RLIMIT_NPROC). Root is exempt from it, so the audit hook also forbids
    # fork and exec, and the PID namespace and group kill reap what remains.
    processes: int = 64
    file_size_mb: int = 10  # RLIMIT_FSIZE: largest file it may write, stdout included

    def __post_init__(self):
        for field in dataclasses.fields(self):
            if not getattr(self, field.name) > 0:
                raise ValueError(f"Limits.{field.name} must be positive, got "
                                 f"{getattr(self, field.name)!r}.")


@dataclasses.dataclass(frozen=True)
class Outcome:
    passed: bool
    status: str  # "passed", "failed", "timeout", "killed" or "error"
    detail: str  # the tail of the sample's stderr, or why it was stopped


class IsolationError(RuntimeError):
    """Kernel isolation was required (``REQUIRE_KERNEL_ENV``) but is not available."""


@dataclasses.dataclass(frozen=True)
class Isolation:
    """The kernel layers samples run under; ``isolation()`` measures them once."""

    command: tuple[str, ...] = ()  # the unshare prefix; () without namespaces
    read_only_root: bool = False  # layer 3: only the box writable, no capabilities
    own_proc: bool = False  # a /proc of the sample's PID namespace, not the host's
    landlock_abi: int = 0  # layer 4; 0: none
    seccomp: bool = False  # no new sockets, keyrings or io_uring (part of layer 3)

    @property
    def namespaces(self) -> tuple[str, ...]:
        return tuple(flag[2:] for flag in self.command if flag[2:] in NAMESPACE_KINDS)

    @property
    def kernel(self) -> bool:
        """True when the kernel, not only the audit hook, keeps the host read-only."""
        return self.read_only_root

    def harness_config(self) -> dict:
        """What the harness must build (True), or skip (False)."""
        return {"filesystem": self.read_only_root, "proc": self.own_proc,
                "landlock": self.landlock_abi > 0, "seccomp": self.seccomp, "probe": False}

    def describe(self) -> str:
        landlock = f"Landlock ABI {self.landlock_abi}" if self.landlock_abi else "no Landlock"
        filtered = "seccomp (no sockets, keyrings, io_uring)" if self.seccomp else "no seccomp"
        if self.kernel:
            proc = "own /proc" if self.own_proc else "the host's /proc, read-only"
            return (f"{KERNEL_LEVEL_PREFIX} {'+'.join(self.namespaces)} namespaces, read-only "
                    f"root, empty read-only /tmp, only the box writable, minimal /dev, no "
                    f"capabilities, {proc}; {filtered}; {landlock}; audit hook")
        namespaces = (f"{'+'.join(self.namespaces)} namespaces" if self.namespaces
                      else "no namespaces")
        if self.landlock_abi:
            return (f"partial kernel: no read-only root ({namespaces}); {landlock} confines "
                    f"creating, removing and writing paths to the box, not chmod, chown, "
                    f"utime or xattrs; {filtered}; audit hook")
        if self.namespaces or self.seccomp:
            return f"no kernel filesystem isolation: {namespaces}; {filtered}; audit hook"
        return "audit hook only: no namespaces, no seccomp, no Landlock"


def _candidates() -> list[Isolation]:
    """Strongest first; optional layers (own /proc, Landlock) are tried by the probe."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return [Isolation()]
    return [Isolation((unshare, *NAMESPACE_FLAGS), read_only_root=True),
            Isolation((unshare, *NAMESPACE_FLAGS_WITHOUT_MOUNT)), Isolation()]


def _probe(candidate: Isolation) -> Isolation | None:
    """Runs PROBE_PROGRAM under ``candidate`` and returns what it measured from
    inside; None when it could not run or the read-only root it was meant to
    have is not there."""
    token = secrets.token_hex(16)
    config = {"filesystem": candidate.read_only_root, "proc": None, "landlock": None,
              "seccomp": None, "probe": True, "token": token, "audit_hook": True}
    try:
        code, stdout, _ = _execute(PROBE_PROGRAM, Limits(wall_s=PROBE_TIMEOUT_S),
                                   candidate.command, config)
    except SandboxError:
        return None
    if code != 0 or not stdout.rstrip().endswith(token.encode()):
        return None
    facts = {}
    for line in stdout.decode("utf-8", "replace").splitlines():
        if line.startswith("{"):
            facts.update(json.loads(line))  # the harness's line, then the program's
    read_only_root = facts["writable_mounts"] == [facts["box"]] and facts["capabilities"] == 0
    if candidate.read_only_root and not read_only_root:
        return None
    return Isolation(candidate.command, read_only_root, read_only_root and facts["own_proc"],
                     facts["landlock_abi"], facts["seccomp"])


@functools.lru_cache(maxsize=1)
def isolation() -> Isolation:
    """The strongest isolation that works here, probed once per process: a probe
    sample runs under each candidate and reports what it can see and do."""
    for candidate in _candidates():
        measured = _probe(candidate)
        if measured is not None:
            return measured
    return Isolation()


def isolation_level() -> str:
    """One line for reports: which layers samples run under on this machine,
    e.g. "kernel: user+mount+net+pid namespaces, read-only root, ...; audit hook"
    or "audit hook only: ..."; starts with ``KERNEL_LEVEL_PREFIX`` when the
    kernel keeps the host read-only."""
    return isolation().describe()


def namespace_command() -> tuple[str, ...]:
    """The ``unshare`` prefix samples run under, () without namespaces."""
    return isolation().command


def _check_isolation(required: bool | None) -> None:
    """Refuses to run without the kernel layer when it is required (None: as
    ``REQUIRE_KERNEL_ENV`` says); otherwise warns, once, that it is missing."""
    if required is None:
        required = os.environ.get(REQUIRE_KERNEL_ENV, "") not in ("", "0")
    if isolation().kernel:
        return
    if required:
        raise IsolationError(
            f"pass@1 must run under kernel isolation ({REQUIRE_KERNEL_ENV}=1 or "
            f"require_kernel_isolation=True), but this machine gives samples only: "
            f"{isolation_level()}. Fix: allow unprivileged user namespaces (sysctl "
            f"user.max_user_namespaces > 0; kernel.unprivileged_userns_clone=1 on Debian "
            f"kernels; kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu 23.10+; in a "
            f"container, a seccomp profile that allows unshare and mount), with util-linux's "
            f"unshare on PATH and Linux 5.12+ (mount_setattr). Or unset {REQUIRE_KERNEL_ENV} "
            f"to accept the weaker isolation.")
    warnings.warn(f"pass@1 sandbox without kernel filesystem isolation: {isolation_level()}. "
                  f"Set {REQUIRE_KERNEL_ENV}=1 to refuse to run like this.", stacklevel=3)


def _pids() -> list[str]:
    try:
        return [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:  # no /proc
        return []


def _threads_of_user(uid: int) -> int:
    """Threads the user runs now: RLIMIT_NPROC counts them all, not only ours."""
    total = 0
    for pid in _pids():
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                total += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:  # it ended while we looked
            pass
    return total


def _live_group_members(pgid: int) -> list[str]:
    """Processes in group ``pgid`` that are not zombies (from /proc/<pid>/stat)."""
    members = []
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
                state, _, group = f.read().rpartition(")")[2].split()[:3]  # name may hold ")"
        except (OSError, ValueError):
            continue
        if int(group) == pgid and state not in ("Z", "X"):
            members.append(pid)
    return members


_PRLIMIT_FLAGS = {resource.RLIMIT_CPU: "--cpu", resource.RLIMIT_AS: "--as",
                  resource.RLIMIT_NPROC: "--nproc", resource.RLIMIT_FSIZE: "--fsize",
                  resource.RLIMIT_CORE: "--core"}


def _wanted_limits(limits: Limits, nproc: int) -> list[tuple[int, int]]:
    wanted = ((resource.RLIMIT_CPU, limits.cpu_s), (resource.RLIMIT_AS, limits.memory_mb * MIB),
              (resource.RLIMIT_NPROC, nproc), (resource.RLIMIT_FSIZE, limits.file_size_mb * MIB),
              (resource.RLIMIT_CORE, 0))
    clamped = []
    for kind, value in wanted:
        hard = resource.getrlimit(kind)[1]  # the child inherits our hard limits
        clamped.append((kind, value if hard == resource.RLIM_INFINITY else min(value, hard)))
    return clamped


def _limit_command(limits: Limits, nproc: int) -> list[str] | None:
    """``prlimit`` sets the limits (soft == hard: they cannot be raised) and execs
    the sample, so no Python runs between fork and exec in our (multithreaded,
    JAX) process: a ``preexec_fn`` there can deadlock on a lock another thread
    held at the fork. None when util-linux's ``prlimit`` is missing."""
    binary = shutil.which("prlimit")
    if binary is None:
        return None
    return [binary, *(f"{_PRLIMIT_FLAGS[kind]}={value}:{value}"
                      for kind, value in _wanted_limits(limits, nproc)), "--"]


def _set_limits(limits: Limits, nproc: int):
    """The preexec fallback (no ``prlimit``): runs in the child between fork and exec."""
    wanted = _wanted_limits(limits, nproc)

    def apply():
        for kind, value in wanted:
            resource.setrlimit(kind, (value, value))  # soft == hard: cannot be raised
    return apply


def _wait_unreaped(pid: int, timeout: float) -> bool:
    """Waits for the child to exit but leaves it a zombie, so its process group
    id cannot be reused before we kill the group. True when it exited."""
    deadline, delay = time.monotonic() + timeout, POLL_MIN_S
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(2 * delay, POLL_MAX_S)
    return True


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILLs the child's process group (start_new_session made the child
    its leader), reaps the child, then waits (bounded) for the members that
    init reaps instead (the PID namespace's first process, orphans)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # no member left
    proc.wait()
    deadline = time.monotonic() + REAP_TIMEOUT_S
    while _live_group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(POLL_MAX_S)


def _remove_tree(path: str) -> None:
    """Deletes the sandbox even where the sample made parts of it read-only."""
    def make_writable_and_retry(func, failed, _exc_info):
        try:
            os.chmod(os.path.dirname(failed), 0o700)
            func(failed)
        except OSError:
            pass
    shutil.rmtree(path, onerror=make_writable_and_retry)


def _tail(f, limit: int) -> bytes:
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - limit))
    return f.read()


def _classify(code: int | None, stdout: bytes, stderr: bytes, token: str,
              limits: Limits) -> Outcome:
    """Maps how the child ended (None: still running at the backstop) to an Outcome."""
    detail = stderr.decode("utf-8", "replace")[-DETAIL_CHARS:]
    if code is None or code == TIMEOUT_EXIT:
        return Outcome(False, "timeout", f"no result after {limits.wall_s:g} s wall-clock; "
                                         f"killed. {detail}".strip())
    if code == 0 and stdout.rstrip().endswith(token.encode()):
        return Outcome(True, "passed", detail)
    if code == 0:
        return Outcome(False, "failed", f"exited before the tests finished. {detail}".strip())
    if code == FAILED_EXIT:
        return Outcome(False, "failed", detail or "the program failed")
    if code == RESOURCE_EXIT:
        return Outcome(False, "killed", f"over the {limits.memory_mb} MiB address-space or "
                                        f"{limits.file_size_mb} MiB file-size limit. "
                                        f"{detail}".strip())
    if code < 0 or code > SIGNAL_EXIT_BASE:
        number = -code if code < 0 else code - SIGNAL_EXIT_BASE
        name = signal.Signals(number).name if number in signal.valid_signals() else number
        return Outcome(False, "killed", f"killed by signal {name} (a resource limit or a "
                                        f"crash). {detail}".strip())
    return Outcome(False, "error", f"sandbox harness failed (exit status {code}). "
                                   f"{detail}".strip())


class SandboxError(RuntimeError):
    """The sandbox itself could not run a sample (not the sample's fault)."""


def _execute(source: str, limits: Limits, prefix: tuple[str, ...], config: dict
             ) -> tuple[int | None, bytes, bytes]:
    """Runs the harness on ``source`` in a new box under the namespace ``prefix``.
    Returns its exit status (None: killed at the backstop) and output tails."""
    try:
        box = tempfile.mkdtemp(prefix=SANDBOX_PREFIX)
    except OSError as exc:
        raise SandboxError(f"sandbox could not make its directory: {exc!r}") from exc
    try:
        with open(os.path.join(box, SAMPLE_FILE), "w", encoding="utf-8") as f:
            f.write(source)
        os.mkdir(os.path.join(box, TMP_SUBDIR))
        env = {"HOME": box, "TMPDIR": os.path.join(box, TMP_SUBDIR), "PATH": os.defpath,
               "LANG": "C.UTF-8"}
        config = {**config, "box": box, "sample": SAMPLE_FILE, "wall_s": limits.wall_s}
        nproc = limits.processes + (_threads_of_user(os.getuid()) if os.getuid() else 0)
        command = [*prefix, sys.executable, "-I", "-c", _HARNESS]
        prlimit = _limit_command(limits, nproc)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(
                command if prlimit is None else prlimit + command, cwd=box, env=env,
                stdin=subprocess.PIPE, stdout=out, stderr=err, start_new_session=True,
                preexec_fn=_set_limits(limits, nproc) if prlimit is None else None)
            try:
                try:
                    proc.stdin.write((json.dumps(config) + "\n").encode())
                    proc.stdin.close()
                except BrokenPipeError:
                    pass  # it died at once; its exit status says why
                exited = _wait_unreaped(proc.pid, limits.wall_s + BACKSTOP_GRACE_S)
            finally:
                _kill_group(proc)
            code = proc.returncode if exited else None
            return code, _tail(out, STDOUT_TAIL_BYTES), _tail(err, 4 * DETAIL_CHARS)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxError(f"sandbox could not run the sample: {exc!r}") from exc
    finally:
        _remove_tree(box)


def _run(source: str, limits: Limits, *, audit_hook: bool = True,
         layers: Isolation | None = None) -> Outcome:
    """run_program; tests pass ``audit_hook=False`` to check the kernel layers
    alone, or ``layers`` to run under other layers than ``isolation()``."""
    layers = isolation() if layers is None else layers
    token = secrets.token_hex(16)
    config = {**layers.harness_config(), "token": token, "audit_hook": audit_hook}
    try:
        code, stdout, stderr = _execute(source, limits, layers.command, config)
    except SandboxError as exc:
        return Outcome(False, "error", str(exc))
    return _classify(code, stdout, stderr, token, limits)


def run_program(source: str, limits: Limits = Limits(), *,
                require_kernel_isolation: bool | None = None) -> Outcome:
    """Runs ``source`` in the sandbox; passed when it runs to its end within the
    limits. Raises IsolationError when kernel isolation is required (None: as
    ``REQUIRE_KERNEL_ENV`` says) and missing."""
    _check_isolation(require_kernel_isolation)
    return _run(source, limits)


def humaneval_program(problem: dict, completion: str) -> str:
    """The program that scores one completion (the reference HumanEval recipe)."""
    if not isinstance(problem, dict):
        raise ValueError(f"a HumanEval problem must be a dict, got {type(problem).__name__}; "
                         f"use specdec_jax.data.humaneval.load_problems().")
    name = problem.get("task_id", "<no task_id>")
    missing = [key for key in HUMANEVAL_KEYS if not isinstance(problem.get(key), str)]
    if missing:
        raise ValueError(f"problem {name!r} lacks the string field(s) {missing}; a HumanEval "
                         f"problem needs {list(HUMANEVAL_KEYS)} (see humaneval.load_problems()).")
    if not isinstance(completion, str):
        raise ValueError(f"the completion for problem {name!r} is a "
                         f"{type(completion).__name__}; pass the generated text as a str.")
    return (problem["prompt"] + completion + "\n\n" + problem["test"]
            + f"\n\ncheck({problem['entry_point']})\n")


def check_humaneval(problem: dict, completion: str, limits: Limits = Limits(), *,
                    require_kernel_isolation: bool | None = None) -> Outcome:
    """Runs the problem's tests against ``prompt + completion`` in the sandbox."""
    return run_program(humaneval_program(problem, completion), limits,
                       require_kernel_isolation=require_kernel_isolation)


def check_humaneval_many(problems: list[dict], completions: list[str],
                         limits: Limits = Limits(), progress: bool = True, *,
                         require_kernel_isolation: bool | None = None) -> list[Outcome]:
    """One sandboxed subprocess per sample, in order. All inputs, and the
    isolation (``run_program``), are checked before anything runs; a sample that
    crashes, hangs or even breaks the harness is scored as not passed, and the
    next sample still runs. ``isolation_level()`` says what they ran under."""
    if len(problems) != len(completions):
        raise ValueError(f"got {len(problems)} problems but {len(completions)} completions; "
                         f"pass exactly one completion per problem, in the same order.")
    programs = [humaneval_program(p, c) for p, c in zip(problems, completions)]
    _check_isolation(require_kernel_isolation)
    outcomes = []
    for program in tqdm(programs, desc="pass@1 sandbox", unit="sample", disable=not progress):
        try:
            outcomes.append(_run(program, limits))
        except Exception as exc:  # one broken sample must not end the run
            outcomes.append(Outcome(False, "error", f"sandbox failure: {exc!r}"))
    return outcomes
