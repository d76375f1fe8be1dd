"""A seccomp filter for script workers: the syscalls a script never needs fail with EPERM,
and sockets of an address family it never needs with EAFNOSUPPORT.

The filter is classic BPF, built here so floom needs no libseccomp binding; bubblewrap loads
it (`--seccomp FD`) after it has set the sandbox up, just before it runs the command.
"""

from __future__ import annotations

import errno
import functools
import platform
import struct
from typing import Final

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6];
_NR_OFFSET: Final = 0
_ARCH_OFFSET: Final = 4
_ARGS_OFFSET: Final = 16
"""args[0]; on these little-endian machines its low 32 bits, all an int argument has."""
_LD_W_ABS: Final = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K: Final = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K: Final = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K: Final = 0x06  # BPF_RET | BPF_K
_RET_ALLOW: Final = 0x7FFF0000
_RET_ERRNO: Final = 0x00050000
# x32 syscalls are x86_64 numbers with this bit set; a filter that lists x86_64 numbers
# would let every x32 twin of a refused syscall through.
_X32_SYSCALL_BIT: Final = 0x40000000

# Syscalls a script worker never needs and that widen the kernel's attack surface or reach
# outside the sandbox: async I/O rings and contexts (io_setup takes its events from one
# machine-wide pool, fs.aio-max-nr, that no cgroup bounds: one run could take it all), tracing
# other processes, kernel keyrings, eBPF,
# perf events, mounts and namespaces (bubblewrap has finished with them before the filter
# applies), kernel modules, and machine-wide switches.
_NAMES: Final = """
    io_uring_setup io_uring_enter io_uring_register
    io_setup io_destroy io_submit io_cancel io_getevents io_pgetevents
    ptrace process_vm_readv process_vm_writev kcmp pidfd_getfd
    kexec_load kexec_file_load
    keyctl add_key request_key
    bpf perf_event_open userfaultfd
    mount umount2 pivot_root move_mount open_tree fsopen fsconfig fsmount fspick mount_setattr
    unshare setns
    init_module finit_module delete_module
    reboot swapon swapoff acct quotactl quotactl_fd syslog
    name_to_handle_at open_by_handle_at
""".split()

_GENERIC_NEW: Final = {
    "pidfd_getfd": 438,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
    "quotactl_fd": 443,
}
_X86_64: Final = {
    **_GENERIC_NEW,
    "io_setup": 206,
    "io_destroy": 207,
    "io_getevents": 208,
    "io_submit": 209,
    "io_cancel": 210,
    "io_pgetevents": 333,
    "ptrace": 101,
    "syslog": 103,
    "pivot_root": 155,
    "acct": 163,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "init_module": 175,
    "delete_module": 176,
    "quotactl": 179,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "kcmp": 312,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
}
_AARCH64: Final = {
    **_GENERIC_NEW,
    "io_setup": 0,
    "io_destroy": 1,
    "io_submit": 2,
    "io_cancel": 3,
    "io_getevents": 4,
    "io_pgetevents": 292,
    "umount2": 39,
    "mount": 40,
    "pivot_root": 41,
    "quotactl": 60,
    "acct": 89,
    "unshare": 97,
    "kexec_load": 104,
    "init_module": 105,
    "delete_module": 106,
    "syslog": 116,
    "ptrace": 117,
    "reboot": 142,
    "add_key": 217,
    "request_key": 218,
    "keyctl": 219,
    "swapon": 224,
    "swapoff": 225,
    "perf_event_open": 241,
    "name_to_handle_at": 264,
    "open_by_handle_at": 265,
    "setns": 268,
    "process_vm_readv": 270,
    "process_vm_writev": 271,
    "kcmp": 272,
    "finit_module": 273,
    "bpf": 280,
    "userfaultfd": 282,
    "kexec_file_load": 294,
}
# machine name -> (AUDIT_ARCH_* value, syscall numbers)
_ARCHES: Final = {
    "x86_64": (0xC000003E, _X86_64),
    "aarch64": (0xC00000B7, _AARCH64),
}
DENIED_SYSCALLS: Final = tuple(_NAMES)

# The address families a script may open sockets of; any other fails with EAFNOSUPPORT, as
# on a kernel built without it. Local sockets, IPv4 and IPv6 (through the run's own network
# namespace), and netlink's routing protocol alone (the C library reads the sandbox's own
# interfaces and addresses with it). Refused as a class: vsock (reaches the hypervisor and
# the host's vsock services whatever the network namespace), packet and XDP sockets, netlink's
# other protocols (kernel uevents, audit, socket diagnostics, generic netlink families), the
# kernel's crypto (AF_ALG) and key (AF_KEY) interfaces, and every other family.
AF_UNIX: Final = 1
AF_INET: Final = 2
AF_INET6: Final = 10
_AF_NETLINK: Final = 16
_NETLINK_ROUTE: Final = 0
ALLOWED_FAMILIES: Final = frozenset({AF_UNIX, AF_INET, AF_INET6})
_SOCKET_CALLS: Final = {"x86_64": (41, 53), "aarch64": (198, 199)}
"""socket and socketpair, by architecture."""
_CLONE_CALLS: Final = {"x86_64": (56, 435), "aarch64": (220, 435)}
"""clone and clone3, by architecture."""
_JSET_K: Final = 0x45  # BPF_JMP | BPF_JSET | BPF_K
# Memory from the machine's huge page pool (vm.nr_hugepages, and its overcommit), which the
# run's memory cgroup does not count: a run could take every huge page the operator set
# aside (for PostgreSQL, say), and overcommitted ones past its memory limit. Refused as a
# class, wherever a flag asks for it: mmap's MAP_HUGETLB, memfd_create's MFD_HUGETLB and
# shmget's SHM_HUGETLB. By architecture: (syscall number, argument index, flag bits).
_MAP_HUGETLB: Final = 0x40000
_MFD_HUGETLB: Final = 0x4
_SHM_HUGETLB: Final = 0o4000
_HUGETLB_CALLS: Final = {
    "x86_64": ((9, 3, _MAP_HUGETLB), (319, 1, _MFD_HUGETLB), (29, 2, _SHM_HUGETLB)),
    "aarch64": ((222, 3, _MAP_HUGETLB), (279, 1, _MFD_HUGETLB), (194, 2, _SHM_HUGETLB)),
}
NAMESPACE_FLAGS: Final = 0x7E020000
"""CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET: clone(2) with any of them
fails with EPERM under the filter `deny_filter(namespaces=True)` builds."""


def supported(machine: str | None = None) -> bool:
    """Whether floom has syscall numbers for this machine's architecture."""
    return (machine or platform.machine()) in _ARCHES


def deny_filter(machine: str | None = None, *, namespaces: bool = False) -> bytes:
    """The filter program (an array of struct sock_filter) for `machine`, this one by
    default. Syscalls of any other ABI (32-bit compat, x32) are refused as a whole.

    With `namespaces`, a process under it cannot make a namespace with clone(2) either (unshare
    and setns it never can), and clone3 fails with ENOSYS, which the C library answers with
    clone: for a warm run (floom/sandbox/local/warm/), which runs in its warm process's user
    namespace, where bubblewrap's --disable-userns does not reach."""
    return _deny_filter(machine or platform.machine(), namespaces)


@functools.cache  # every sandbox gets the same program: built once per process
def _deny_filter(machine: str, namespaces: bool = False) -> bytes:
    if machine not in _ARCHES:
        raise ValueError(f"no seccomp syscall table for {machine}")
    audit_arch, numbers = _ARCHES[machine]
    denied = sorted({numbers[name] for name in _NAMES})
    socket_calls = _SOCKET_CALLS[machine]
    program = _Program()
    program.load(_ARCH_OFFSET)
    program.jump_if(audit_arch, "next", "deny")
    program.load(_NR_OFFSET)
    if machine == "x86_64":
        program.jump_if_at_least(_X32_SYSCALL_BIT, "deny", "next")
    for number in socket_calls:
        program.jump_if(number, "family", "next")
    hugetlb_calls = _HUGETLB_CALLS[machine]
    for number, _, _ in hugetlb_calls:
        program.jump_if(number, f"hugetlb-{number}", "next")
    if namespaces:
        clone, clone3 = _CLONE_CALLS[machine]
        program.jump_if(clone, "clone", "next")
        program.jump_if(clone3, "no_clone3", "next")
    for number in denied:
        program.jump_if(number, "deny", "next")
    program.ret(_RET_ALLOW)
    # socket(2) and socketpair(2): the address family is their first argument.
    program.label("family")
    program.load(_ARGS_OFFSET)
    for family in sorted(ALLOWED_FAMILIES):
        program.jump_if(family, "allow", "next")
    program.jump_if(_AF_NETLINK, "next", "no_family")
    program.load(_ARGS_OFFSET + 16)  # the protocol, the third argument
    program.jump_if(_NETLINK_ROUTE, "allow", "no_family")
    program.label("allow")
    program.ret(_RET_ALLOW)
    program.label("no_family")
    program.ret(_RET_ERRNO | errno.EAFNOSUPPORT)
    for number, argument, bits in hugetlb_calls:
        # The flags' low 32 bits, all these flags are in.
        program.label(f"hugetlb-{number}")
        program.load(_ARGS_OFFSET + 8 * argument)
        program.jump_if_any(bits, "deny", "next")
        program.ret(_RET_ALLOW)
    if namespaces:
        # clone(2): its flags are the first argument (low 32 bits hold every CLONE_NEW*).
        program.label("clone")
        program.load(_ARGS_OFFSET)
        program.jump_if_any(NAMESPACE_FLAGS, "deny", "next")
        program.ret(_RET_ALLOW)
        program.label("no_clone3")
        program.ret(_RET_ERRNO | errno.ENOSYS)
    program.label("deny")
    program.ret(_RET_ERRNO | errno.EPERM)
    return program.assemble()


class _Program:
    """A classic BPF program whose forward jumps name labels ("next": the next one)."""

    def __init__(self) -> None:
        self._insns: list[tuple[int, str, str, int]] = []
        self._labels: dict[str, int] = {}

    def load(self, offset: int) -> None:
        self._insns.append((_LD_W_ABS, "next", "next", offset))

    def jump_if(self, value: int, then: str, otherwise: str) -> None:
        self._insns.append((_JEQ_K, then, otherwise, value))

    def jump_if_any(self, bits: int, then: str, otherwise: str) -> None:
        self._insns.append((_JSET_K, then, otherwise, bits))

    def jump_if_at_least(self, value: int, then: str, otherwise: str) -> None:
        self._insns.append((_JGE_K, then, otherwise, value))

    def ret(self, value: int) -> None:
        self._insns.append((_RET_K, "next", "next", value))

    def label(self, name: str) -> None:
        self._labels[name] = len(self._insns)

    def assemble(self) -> bytes:
        def offset(at: int, label: str) -> int:
            if label == "next":
                return 0
            distance = self._labels[label] - at - 1
            assert 0 <= distance <= 255, "classic BPF jumps forward, at most 255"
            return distance

        return b"".join(
            struct.pack("=HBBI", code, offset(at, then), offset(at, otherwise), k)
            for at, (code, then, otherwise, k) in enumerate(self._insns)
        )
