"""Dropping everything the worker no longer needs once it is inside the pod netns.

The worker parses bytes chosen by the pod (HTTP responses, HTTP/2 frames); after
this it holds no more power than the pod itself: no supplementary groups, an
unprivileged uid/gid, no capabilities, no way to regain any (no_new_privs),
bounded memory and file descriptors so a hostile target cannot bloat it, and (on
x86_64) a seccomp filter refusing the system calls that widen the kernel's attack
surface and that a prober never makes: namespaces, exec, ptrace, bpf, io_uring...,
and any AF_INET / AF_INET6 socket(): every probe socket comes from the netns broker.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import struct

PR_SET_PDEATHSIG = 1
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
# Every capability set of /proc/self/status that must be empty after the drop
# (CapBnd only limits what could be regained, and no_new_privs already forbids that).
CAPABILITY_SETS = (b"CapInh", b"CapPrm", b"CapEff", b"CapAmb")

_libc = ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class PrivilegeError(Exception):
    pass


def _prctl(option: int, arg: int) -> None:
    if _libc.prctl(option, arg, 0, 0, 0) != 0:
        raise PrivilegeError(f"prctl({option}) failed: {os.strerror(ctypes.get_errno())}")


def apply_limits(max_memory_bytes: int, max_open_files: int) -> None:
    """Lowers RLIMIT_AS and RLIMIT_NOFILE (before the drop, while raising is still possible)."""
    for kind, value in ((resource.RLIMIT_AS, max_memory_bytes), (resource.RLIMIT_NOFILE, max_open_files)):
        if value > 0:
            resource.setrlimit(kind, (value, value))


def capabilities() -> dict[bytes, int]:
    """The capability sets of this process, e.g. {b"CapEff": 0, ...}."""
    # Bytes, not text: a codec is imported lazily on first use, and after the drop
    # the interpreter's files may no longer be readable.
    sets = {}
    with open("/proc/self/status", "rb") as f:
        for line in f:
            name, _, value = line.partition(b":")
            if name.startswith(b"Cap"):
                sets[name] = int(value.strip(), 16)
    return sets


def effective_capabilities() -> int:
    caps = capabilities()
    if b"CapEff" not in caps:
        raise PrivilegeError("CapEff not found in /proc/self/status")
    return caps[b"CapEff"]


def _clear_inheritable_capabilities() -> None:
    # setuid away from 0 empties the permitted, effective and ambient sets, but not the
    # inheritable one (a daemon started with inheritable capabilities would pass them on).
    data = (_CapData * 2)()  # all zero: lowering is always allowed
    if _libc.capset(ctypes.byref(_CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)), data) != 0:
        raise PrivilegeError(f"capset failed: {os.strerror(ctypes.get_errno())}")


def drop_privileges(uid: int, gid: int) -> None:
    """Groups first, then gid, then uid (after setuid we could no longer change groups)."""
    try:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    except OSError as exc:
        raise PrivilegeError(f"cannot drop to uid {uid} gid {gid}: {exc.strerror}") from None
    _clear_inheritable_capabilities()
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    install_syscall_filter()
    left = {name: value for name, value in capabilities().items() if name in CAPABILITY_SETS and value}
    if left:
        sets = ", ".join(f"{name.decode()}={value:016x}" for name, value in left.items())
        raise PrivilegeError(f"capabilities remain after dropping privileges: {sets}")
    if os.getgroups():
        raise PrivilegeError(f"supplementary groups remain after dropping privileges: {os.getgroups()}")


# --- seccomp ----------------------------------------------------------------------------

AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x40000000
# x86_64 numbers. Refused with EPERM, as if the worker lacked the privilege (it does), so that
# Python raises PermissionError rather than the process being killed.
DENIED_SYSCALLS_X86_64 = {
    "execve": 59, "execveat": 322,                      # a prober runs no program
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
    "unshare": 272, "setns": 308,                        # user namespaces would hand back capabilities
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "keyctl": 250, "add_key": 248, "request_key": 249,
    "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320,
    "open_by_handle_at": 304, "name_to_handle_at": 303,
    "swapon": 167, "swapoff": 168, "reboot": 169, "acct": 163,
}
_CLONE = 56
_SOCKET = 41
# Families a worker never makes a socket of: its network sockets come from the broker, made inside a sandbox.
DENIED_SOCKET_FAMILIES = (2, 10)  # AF_INET, AF_INET6
_CLONE3 = 435  # its flags are behind a pointer a filter cannot read: ENOSYS makes glibc use clone()
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET: clone() may make threads only.
CLONE_NAMESPACE_FLAGS = 0x7E020000

_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JGE_K, _BPF_JSET_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000
_EPERM, _ENOSYS = 1, 38
_OFFSET_NR, _OFFSET_ARCH, _OFFSET_ARG0 = 0, 4, 16  # struct seccomp_data (arg0's low word, little endian)


def syscall_filter_program() -> bytes:
    """The x86_64 filter as struct sock_filter[]: pure, so that it can be read and tested."""
    denied = sorted(DENIED_SYSCALLS_X86_64.values())
    families = DENIED_SOCKET_FAMILIES
    # The instructions before the three returns at the end: arch, nr, x32, the denied calls, clone3, socket
    # and clone tests, clone's flags (load, test), socket's family (load, one test per family).
    checks = 10 + len(denied) + len(families)
    allow, eperm, enosys = checks, checks + 1, checks + 2

    def to(target: int) -> int:  # a jump from the instruction about to be appended
        return target - len(program) - 1

    program = [(_BPF_LD_W_ABS, 0, 0, _OFFSET_ARCH)]
    # Another architecture's numbers (i386 via int 0x80) mean other calls: refuse them all.
    program.append((_BPF_JEQ_K, 0, to(eperm), AUDIT_ARCH_X86_64))
    program.append((_BPF_LD_W_ABS, 0, 0, _OFFSET_NR))
    program.append((_BPF_JGE_K, to(eperm), 0, _X32_SYSCALL_BIT))
    for nr in denied:
        program.append((_BPF_JEQ_K, to(eperm), 0, nr))
    program.append((_BPF_JEQ_K, to(enosys), 0, _CLONE3))
    socket_check = len(program) + 4  # past the socket test, the clone test and clone's two instructions
    program.append((_BPF_JEQ_K, to(socket_check), 0, _SOCKET))
    program.append((_BPF_JEQ_K, 0, to(allow), _CLONE))
    program.append((_BPF_LD_W_ABS, 0, 0, _OFFSET_ARG0))
    program.append((_BPF_JSET_K, to(eperm), to(allow), CLONE_NAMESPACE_FLAGS))
    assert len(program) == socket_check
    program.append((_BPF_LD_W_ABS, 0, 0, _OFFSET_ARG0))
    for i, family in enumerate(families):
        last = i == len(families) - 1
        program.append((_BPF_JEQ_K, to(eperm), to(allow) if last else 0, family))
    assert len(program) == checks
    program += [(_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW), (_BPF_RET_K, 0, 0, _SECCOMP_RET_ERRNO | _EPERM),
                (_BPF_RET_K, 0, 0, _SECCOMP_RET_ERRNO | _ENOSYS)]
    return b"".join(struct.pack("<HBBI", *instruction) for instruction in program)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_syscall_filter() -> bool:
    """Installs the filter (after no_new_privs); False where there is none for this architecture."""
    if os.uname().machine != "x86_64":
        return False
    program = syscall_filter_program()
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise PrivilegeError(f"seccomp filter: {os.strerror(ctypes.get_errno())}")
    return True


def die_with_parent() -> None:
    # Set after the drop: the kernel clears the parent-death signal on credential changes.
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
