"""What runs inside a warm process, and in each run forked from it: the standard library only.

floom starts this file's source as `python3 -u -B -c SOURCE warm ...` under bubblewrap
(floom/sandbox/local/warm/process.py), as root with a few capabilities in a user namespace of
its own (none on the host: its root is a sandbox uid no run has), in a sandbox that
holds the node's system directories and nothing of any run, and in a PID namespace of its
own, whose pid 1 (`_stay_init`) only reaps: the warm process proper is its child, and sees
no process of the host's nor of any other sandbox. It imports the modules it was
given (names floom recorded from a cold run, `record`), refusing any that starts a thread,
then waits on the control socket floom handed over. Per run floom asks it to prepare a
child: forked into a new PID namespace (of which it is pid 1), it joins the run's cgroup,
enters new mount, network, IPC, UTS and cgroup namespaces, mounts its own /tmp, /dev/shm
(of the size floom sent, the version's memory limit) and /dev/pts, makes inherited shared
mappings private and waits for the run. When the run arrives, pid 1 mounts the run's dirs
(and resizes /tmp and /dev/shm to the run's memory limit should it differ), drops to
the run's uid without capabilities, sets no_new_privs and the seccomp filter, and only then
reads the run's environment and runs its script. floom reads pid 1's exit status from its
pidfd (Linux 6.15+), or sooner from /proc once pid 1, alone in its run, has ended its
output and begun its exit (runs.py `_Supervision`); on older kernels (`direct` false) the
child stays outside the run's PID namespace instead, forks pid 1, reaps it and reports its
status. Every pid floom needs it gets as a pidfd (SCM_RIGHTS): no pid of the warm
namespace means anything on the host.

`python3 -c SOURCE record run.py ...` runs a script as a cold run does and writes the
modules of the Python installation it loaded to RECORD_NAME in its working directory.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import fcntl
import gc
import importlib
import json
import os
import re
import resource
import runpy
import signal
import socket
import struct
import sys
import threading
from os import _exit  # documented: ends a forked child without the parent's clean-up

RECORD_NAME = ".floom-warm-modules"
MAX_MESSAGE = 65536
WORK, OUTPUT = "/work", "/output"
STAGE = "/run/floom-warm"
PTYS_PER_RUN = 64
"""How many pseudo-terminals a run may hold at once. Their count is machine-wide
(kernel.pty.max, 4096 by default, no cgroup bounds it), so each run gets a devpts instance
of its own with this `max`: without it, one run could take every pty of every other
sandbox and container on the node."""
DEVPTS_OPTIONS = f"newinstance,ptmxmode=0666,mode=620,max={PTYS_PER_RUN}"
# Refused whatever a cold run loaded: importing them acts (a browser, a window, text, the
# CPython test suite's autotest running every test). The warm process imports what a run
# recorded as root of its user namespace, with the capabilities its children need there
# (none of the host's), so what a worker names there must be a library to load, never a
# program to run.
SIDE_EFFECT_MODULES = frozenset(
    "antigravity this __hello__ __phello__ idlelib tkinter turtle turtledemo ensurepip "
    "__main__ site sitecustomize usercustomize readline rlcompleter pydoc test".split()
)


def preloadable(name: str) -> bool:
    """Whether the warm process may import module `name` (a dotted name, checked already):
    not one of SIDE_EFFECT_MODULES, nor any package's `__main__`, which runs its program on
    import (`venv.__main__` creates environments, `unittest.__main__` runs tests)."""
    parts = name.split(".")
    return parts[0] not in SIDE_EFFECT_MODULES and "__main__" not in parts


_CLONE_NEWNS = 0x00020000
_CLONE_NEWCGROUP = 0x02000000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2
_MOVE_MOUNT_F_EMPTY_PATH = 4
_SYS_MOVE_MOUNT = 429  # the same number on every architecture since Linux 5.2
_PR_SET_PDEATHSIG = 1
_PR_CAPBSET_READ = 23
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_SECCOMP_MODE_FILTER = 2
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 1
_PROT = {"r": 1, "w": 2, "x": 4}
_MAP_PRIVATE = 0x02
_MAP_FIXED = 0x10
_MAP_ANONYMOUS = 0x20
# A line of /proc/self/maps whose mapping is shared: its start, end and permissions.
_BOUNDING: list[int] = []
"""The capabilities a run drops from its bounding set (all of them: warm sets it)."""
_PREMOUNTED: list[int] = []
"""In a prepared child: the size of the /tmp and /dev/shm it mounted before its run was
asked for (the version's memory limit, which floom sends with `prepare`), or 0 for none."""
_MAX_FD = 2**31 - 1
_SHARED_MAPPING = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) ([-r][-w][-x])s ", re.MULTILINE)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _mount(source: str, target: str, fstype: str, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(source.encode(), target.encode(), fstype.encode(), flags, data.encode()),
        f"mount {target}",
    )


def _prctl(option: int, arg: int | ctypes.c_void_p = 0) -> None:
    _check(_libc.prctl(option, arg, 0, 0, 0), f"prctl {option}")


def _send(sock: socket.socket, message: dict[str, object], fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def _receive(sock: socket.socket) -> tuple[dict[str, object], list[int]]:
    data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 16)
    if not data:
        raise EOFError("floom closed the socket")
    return json.loads(data), fds


# -- the warm process ------------------------------------------------------------------------


def warm(control_fd: int, modules: list[str], seccomp_hex: str, *, direct: bool) -> None:
    """Preload `modules`, then serve `prepare` requests on the control socket until floom
    closes it, then wait for the runs it forked to end (`direct`: each run's pid 1 is a
    child of this process, which must outlive it)."""
    sys.path[:] = [p for p in sys.path if p and os.path.isabs(p)]
    control = socket.socket(fileno=control_fd)
    refused = _preload(modules)
    if refused.startswith("thread:"):
        _send(control, {"refused": refused[len("thread:") :]})
        _exit(3)
    # The runs' children report to floom themselves, or floom reads their ends from their
    # pidfds: their parent here never waits for them (the kernel reaps them at once).
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC) if direct else -1
    # What is imported now, the runs' collections never walk (nor copy, page by page).
    gc.collect()
    gc.freeze()
    # A bounding set only shrinks: what each run drops is what is in it now.
    _BOUNDING[:] = _bounding_set()
    # Its own pidfd and its namespace's pid 1's: floom tells them apart from the host.
    pidfds = [os.pidfd_open(os.getpid()), os.pidfd_open(1)]
    _send(control, {"ready": True, "modules": len(sys.modules)}, pidfds)
    for fd in pidfds:
        os.close(fd)
    seccomp = bytes.fromhex(seccomp_hex)
    while True:
        try:
            request, fds = _receive(control)
        except (EOFError, OSError):
            _await_children()
        if request.get("op") != "prepare" or len(fds) < 3:
            for fd in fds:
                os.close(fd)
            continue
        try:
            if direct:
                # The next child is pid 1 of a PID namespace of its own.
                _check(_libc.unshare(_CLONE_NEWPID), "unshare")
            pid = os.fork()
        except OSError as exc:
            pid = -1
            _refuse(fds, f"cannot prepare the warm run: {exc}")
        if pid == 0:
            control.close()
            memory = request.get("memory_bytes")
            _PREMOUNTED.append(memory if isinstance(memory, int) and memory > 0 else 0)
            _child(fds, seccomp, direct=direct)  # never returns
        if direct:
            # This process's children go to its own namespace again: only from there may
            # it make the next one.
            _libc.setns(own_pid_ns, _CLONE_NEWPID)
        if pid > 0:
            for fd in fds:
                os.close(fd)


def _await_children() -> None:
    """Exit once every child has ended (with SIGCHLD ignored, wait returns only then)."""
    while True:
        try:
            os.wait()
        except ChildProcessError:
            _exit(0)
        except InterruptedError:
            continue


def _refuse(fds: list[int], message: str) -> None:
    try:
        _send(socket.socket(fileno=os.dup(fds[0])), {"error": message})
    except OSError:
        pass
    for fd in fds:
        os.close(fd)


def _bounding_set() -> list[int]:
    """The capabilities in this process's bounding set."""
    held = []
    for cap in range(64):
        found = _libc.prctl(_PR_CAPBSET_READ, cap, 0, 0, 0)
        if found < 0:
            break  # past the kernel's last capability
        if found:
            held.append(cap)
    return held


def _preload(modules: list[str]) -> str:
    """Import each module; "thread:NAME" when one started a thread (the process may not
    fork then), else ""."""
    for name in modules:
        if not preloadable(name) or name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except BaseException:
            continue
        if _thread_count() > 1:
            return f"thread:{name}"
    return ""


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


# -- one run's child ---------------------------------------------------------------------------


def _child(fds: list[int], seccomp: bytes, *, direct: bool) -> None:
    """The prepared child: `fds` are its socket to floom, the run's stdout and stderr, then
    the cgroup.procs files of the run's cgroup. Joins the cgroup and enters the namespaces;
    `direct`, it is the run's pid 1 already, else it forks the run's pid 1, reports, and
    waits for it."""
    chan_fd, out_fd, err_fd, *cgroup_fds = fds
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in cgroup_fds:
            os.write(fd, b"0")  # "0": the writer itself
            os.close(fd)
        flags = _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS
        if not direct:
            flags |= _CLONE_NEWPID
        _check(_libc.unshare(flags | _CLONE_NEWCGROUP), "unshare")
        _mount("none", "/", "", _MS_REC | _MS_PRIVATE)
        socket.sethostname("floom")
        _loopback_up()
        _close_other_fds({chan_fd, out_fd, err_fd})
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.close(out_fd)
        os.close(err_fd)
        pid = 0 if direct else os.fork()
        # floom knows the run's processes by pidfds: their pids here mean nothing there.
        own = os.pidfd_open(os.getpid())
    except BaseException as exc:
        _fail(chan_fd, f"cannot prepare the warm run: {exc}")
    if pid == 0:
        if not direct:
            os.close(own)  # its parent's, which reports it
        _pid_one(chan_fd, seccomp, ready=own if direct else None)  # never returns
    chan = socket.socket(fileno=chan_fd)
    os.close(1)
    os.close(2)
    try:
        init = os.pidfd_open(pid)
    except OSError as exc:
        _fail(chan_fd, f"cannot prepare the warm run: {exc}")
    _send(chan, {"ready": True}, [own, init])
    os.close(own)
    os.close(init)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            status = -1
            break
    try:
        _send(chan, {"status": status})
    finally:
        _exit(0)


def _fail(chan_fd: int, message: str) -> None:
    try:
        _send(socket.socket(fileno=chan_fd), {"error": message})
    finally:
        _exit(125)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def _close_other_fds(keep: set[int]) -> None:
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else ():
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    if not os.path.isdir("/proc/self/fd"):
        for fd in range(3, 1024):
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass


def _pid_one(chan_fd: int, seccomp: bytes, *, ready: int | None) -> None:
    """The run's pid 1: its own /proc, then the run's setup, the drop, and its script.
    `ready`: its own pidfd, sent to floom once prepared (None: its parent said it is)."""
    chan = socket.socket(fileno=chan_fd)
    try:
        _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        # The run's own /tmp, /dev/shm and /dev/pts, fresh in this child's own mount
        # namespace, made now rather than once the run is asked for (`_setup`).
        _mount_scratch(_PREMOUNTED[0] if _PREMOUNTED else 0)
        # Before the run is asked for (it is not on the run's path), and before any of it.
        _make_shared_mappings_private()
        if ready is not None:
            _send(chan, {"ready": True}, [ready])
            os.close(ready)
        request, fds = _receive(chan)
        _setup(request, fds)
        # Without a reporter, pid 1 must outlive the warm process (floom reads its end).
        _drop(int(request["uid"]), seccomp, pdeathsig=ready is None)  # type: ignore[call-overload]
    except BaseException as exc:
        _fail(chan_fd, f"cannot start the warm run: {exc}")
    _send(chan, {"dropped": True})
    # From here on this process is the run's: what it reads next is the run's own.
    try:
        _start, fds = _receive(chan)
        with os.fdopen(fds[0], "rb") as source:
            source.seek(0)  # floom's description of the memory file, at its end
            given = json.loads(source.read())
        for fd in fds[1:]:
            os.close(fd)
    except BaseException:
        _exit(125)
    chan.close()
    os.environ.clear()
    os.environ.update(given["env"])
    if "random" in sys.modules:
        sys.modules["random"].seed()  # entropy drawn now, by this run alone
    run_script(list(given["argv"]))


def _setup(request: dict[str, object], fds: list[int]) -> None:
    """Mount the run's dirs (detached mounts floom made of its work and output dirs, or the
    version's files and the run dir for an overlay), its /tmp, /dev/shm and /dev/pts, and
    set its per-process limits."""
    memory = int(request["memory_bytes"])  # type: ignore[call-overload]
    if request.get("overlay"):
        files_fd, run_fd, output_fd = fds
        _move_mount(files_fd, f"{STAGE}/files")
        _move_mount(run_fd, f"{STAGE}/run")
        work = f"{STAGE}/run/{request['work_name']}"
        options = f"lowerdir={STAGE}/files,upperdir={work},workdir={work}.overlay,userxattr"
        _mount("overlay", WORK, "overlay", _MS_NOSUID | _MS_NODEV, options)
        _check(_libc.umount2(f"{STAGE}/files".encode(), _MNT_DETACH), "umount files")
        _check(_libc.umount2(f"{STAGE}/run".encode(), _MNT_DETACH), "umount run")
    else:
        work_fd, output_fd = fds
        _move_mount(work_fd, WORK)
    for name in request.get("read_only") or ():  # type: ignore[attr-defined]
        # Bound read-only over itself: the run cannot write, chmod, rename or delete it.
        # (A bind's remount sets its flags anew: nosuid and nodev named again, as bwrap does.)
        path = f"{WORK}/{name}"
        _mount(path, path, "", _MS_BIND)
        _mount("none", path, "", _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    _move_mount(output_fd, OUTPUT)
    premounted = _PREMOUNTED[0] if _PREMOUNTED else 0
    if premounted != memory:
        # Mounted ahead for another size (or not at all): made the run's size now.
        flags = _MS_NOSUID | _MS_NODEV | (_MS_REMOUNT if premounted else 0)
        options = f"size={memory}" if premounted else f"size={memory},mode=1777"
        for target in ("/tmp", "/dev/shm"):
            _mount("tmpfs", target, "tmpfs", flags, options)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for name, key in (("fsize_bytes", resource.RLIMIT_FSIZE), ("data_bytes", resource.RLIMIT_DATA)):
        value = request.get(name)
        if isinstance(value, int):
            resource.setrlimit(key, (value, value))


def _mount_scratch(memory: int) -> None:
    """Mount a prepared child's /tmp and /dev/shm, tmpfs of `memory` bytes (none for 0: its
    run's `_setup` mounts them), and its own /dev/pts."""
    if memory:
        for target in ("/tmp", "/dev/shm"):
            _mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={memory},mode=1777")
    # Not the warm process's instance, which every run of it would share.
    _mount("devpts", "/dev/pts", "devpts", _MS_NOSUID | _MS_NOEXEC, DEVPTS_OPTIONS)


def _move_mount(fd: int, target: str) -> None:
    _check(
        _libc.syscall(
            _SYS_MOVE_MOUNT,
            fd,
            b"",
            -100,  # AT_FDCWD
            target.encode(),
            _MOVE_MOUNT_F_EMPTY_PATH,
        ),
        f"move_mount {target}",
    )
    os.close(fd)


def _make_shared_mappings_private() -> None:
    """Give every shared mapping the warm process made (at import, say) a private copy:
    otherwise what one run writes there, the next run and the warm process would read."""
    with open("/proc/self/maps") as maps:
        found = _SHARED_MAPPING.findall(maps.read())
    for first, last, perms in found:
        start, end = int(first, 16), int(last, 16)
        size = end - start
        readable = "r" in perms
        if not readable:
            _check(_libc.mprotect(ctypes.c_void_p(start), size, 1), "mprotect")
        saved = ctypes.string_at(start, size)
        prot = sum(_PROT[c] for c in perms[:3] if c in _PROT)
        address = _libc.mmap(
            ctypes.c_void_p(start),
            size,
            prot | 2,  # writable while the contents are put back
            _MAP_PRIVATE | _MAP_FIXED | _MAP_ANONYMOUS,
            -1,
            0,
        )
        if address is None or address != start:
            raise OSError(errno.ENOMEM, "cannot replace a shared mapping")
        ctypes.memmove(start, saved, size)
        if prot != prot | 2:
            _check(_libc.mprotect(ctypes.c_void_p(start), size, prot), "mprotect")


def _drop(uid: int, seccomp: bytes, *, pdeathsig: bool) -> None:
    """Become `uid` with no capability left (bounding, ambient, inheritable, permitted,
    effective), no_new_privs, the parent-death signal (`pdeathsig`) and the seccomp
    filter."""
    if os.getgroups():
        os.setgroups([])  # none already: floom starts the warm process without any
    os.setresgid(uid, uid, uid)
    for cap in _BOUNDING or range(64):
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) < 0:
            if ctypes.get_errno() == errno.EINVAL:
                break  # past the kernel's last capability
            _check(-1, f"drop capability {cap}")
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    os.setresuid(uid, uid, uid)
    _capset_none()
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    if pdeathsig:
        # Cleared by the uid change above: set after it, so pid 1 ends with its reaper.
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if seccomp:
        buffer = ctypes.create_string_buffer(seccomp, len(seccomp))
        program = _Fprog(len(seccomp) // 8, ctypes.cast(buffer, ctypes.c_char_p))
        _check(
            _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0),
            "seccomp",
        )
    os.chdir(WORK)


def _capset_none() -> None:
    """Empty this process's permitted, effective and inheritable capabilities."""
    header = struct.pack("=Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = ctypes.create_string_buffer(24)  # two zeroed __user_cap_data_struct
    _check(_libc.capset(ctypes.c_char_p(header), data), "capset")


# -- running the script, warm or recording -----------------------------------------------------


def run_script(argv: list[str], *, record: bool = False) -> None:
    """Run the script `argv[0]` with `argv` as sys.argv, as `python3 SCRIPT ARGS...` would;
    exits the process with its exit code."""
    os.closerange(3, _MAX_FD)  # one close_range call: no listing of /proc/self/fd
    script = argv[0]
    path = os.path.abspath(script)
    sys.argv[:] = argv
    directory = os.path.dirname(path)
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path[0] = directory
    else:
        sys.path.insert(0, directory)
    if record:
        atexit.register(_write_record, os.path.join(os.getcwd(), RECORD_NAME))
    if not os.path.exists(path):
        sys.stderr.write(
            f"python3: can't open file {path!r}: [Errno 2] No such file or directory\n"
        )
        _finish(2)
    code = 0
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        sys.excepthook(type(exc), exc, tb or exc.__traceback__)
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
    _finish(code)


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    sys.stderr.write(f"{value}\n")
    return 1


def _finish(code: int) -> None:
    """End as the interpreter ends (non-daemon threads waited for, atexit run, streams
    flushed), but without tearing its objects down: in a process forked from a warm one,
    that would write to (and so copy) every page of the warm process's heap, 30-70 ms.
    Its output ends before its exit does: floom, seeing it end, reads the exit status as
    soon as the kernel has it (runs.py `_Supervision`), not once the kernel has torn the
    process's address space and namespaces down (about 1-3 ms)."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        for fd in (1, 2):
            try:
                os.close(fd)
            except OSError:
                pass
        _exit(code)


def _write_record(path: str) -> None:
    """The modules of this interpreter's installation the run has loaded, one per line."""
    roots = tuple(
        os.path.join(os.path.realpath(p), "")
        for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}
    )
    names = []
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if origin is None:
            if name in sys.builtin_module_names:
                names.append(name)
            continue
        if isinstance(origin, str) and os.path.realpath(origin).startswith(roots):
            names.append(name)
    try:
        with open(path, "w") as out:
            out.write("\n".join(sorted(names)))
    except OSError:
        pass


def _stay_init(control_fd: int) -> None:
    """Fork the warm process proper and stay its PID namespace's pid 1, reaping until no
    process is left there: the runs outlive a warm process that dies (they are handed to
    this process, which keeps their namespace), and the namespace ends with the last one.
    bubblewrap kills this process (and so the namespace) should floom die."""
    pid = os.fork()
    if pid == 0:
        return
    os.close(control_fd)  # floom sees the warm process end when it ends
    # Reaping needs no privilege: none is left to the process the runs are handed to.
    # (Dropping capabilities keeps the parent-death signal bubblewrap set, unlike a uid change.)
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    _capset_none()
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    _await_children()


def main(args: list[str]) -> None:
    if args[0] == "warm":
        modules = args[4].split(",") if len(args) > 4 and args[4] else []
        _stay_init(int(args[1]))
        warm(int(args[1]), modules, args[2], direct=args[3] == "direct")
    elif args[0] == "record":
        run_script(args[1:], record=True)
    else:
        sys.exit(f"unknown mode {args[0]!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
