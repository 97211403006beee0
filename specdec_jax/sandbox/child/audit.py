"""Layer 5, in the sample process: an audit hook (``sys.addaudithook``) over the sample.

It refuses sockets, ctypes, starting programs or processes, signalling
processes, raising limits, the introspection that could reach the hook's own
state, and writes, renames, deletions or mode changes of paths outside the box.
It is a deny-list of Python functions: a syscall without an audit event
(``os.mkfifo``, ``os.mknod``) passes it, which is why the kernel layers exist.

Runs inside the sandboxed child only (loaded by path by ``harness.py``):
standard library only, no imports from the package.
"""

import os
import stat
import sys

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


def make_hook(box):
    """The hook for a sample whose box is ``box`` (a resolved path). Everything
    it uses is bound here, in its closure: the sample may later rebind names in
    builtins, os, posixpath or this module."""
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

