"""Layers 3 and 4, in the sample process: no capabilities, seccomp and Landlock.

The sample drops every capability (no_new_privs, locked securebits, an empty
bounding set), so it cannot mount, remount or unmount its way out of the
read-only root; a seccomp filter refuses the syscalls the namespaces do not
fence; Landlock refuses creating, removing, renaming, writing or truncating
paths outside the box, TCP and (ABI 6+) signals to processes outside it.

Runs inside the sandboxed child only (loaded by path by ``harness.py``):
standard library only, no imports from the package.
"""

import errno
import os
import struct

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


def confine_process(load_libc, config, box):
    """The sample process's own kernel layers, as the config asks: a True layer
    must be applied, None (the probe) is tried, False is skipped. Returns the
    layers applied: {"landlock_abi": 0 for none, "seccomp": bool}. ``load_libc``:
    ``libc.load_libc``, called here so that a failure to load it is tolerated
    where no layer is required."""
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

