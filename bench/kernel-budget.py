#!/usr/bin/python3
"""A server's CPU per request split by part, from one bench/kernel.sh run
traced with TRACE=perf-record (perf record -g on the server's process).

    bench/kernel-budget.py OUTDIR/trace/ROUND-CONNS-JOB.SERVER.perf-record [US_PER_REQUEST]

Each sample goes to one part by its call chain: the syscall it is in
(epoll_wait: going to sleep and being woken; futex: a thread hand-off or
a contended lock; the receive and send syscalls: TCP's work and the
kernel's copy), or, in user space, the function it is in (memcpy, the
plugin, locks, libevent, the server's own code).  US_PER_REQUEST (the
run's "server CPU µs/request" from kernel.md) turns the shares into
microseconds.  Limits: without a PMU (a VM) perf samples on the CPU
clock, and time with interrupts off is charged where they come back on:
the scheduler's switch (finish_task_switch) carries the cost of a
wake-up.  User call chains need frame pointers, which neither blkd nor
Debian's nbdkit has: user parts go by the sampled function alone."""
import collections
import subprocess
import sys


def parts_of(chain):
    leaf = chain[0] if chain else ""
    txt = " ".join(chain)
    if "[kernel.kallsyms]" in leaf:
        if "finish_task_switch" in leaf and ("sk_wait_data" in txt or "sk_stream_wait" in txt
                                             or "wait_woken" in txt):
            return "sleep, wake-up in a blocking socket call"
        if "do_epoll_wait" in txt or "epoll_wait" in txt:
            return "epoll_wait (sleep, wake-up)"
        if "futex" in txt or "lll_lock" in txt:
            return "futex (thread hand-off, locks)"
        if any(k in txt for k in ("tcp_sendmsg", "__sys_sendto", "sendmsg", "__send ",
                                  "sock_sendmsg", "tcp_write_xmit")):
            return "send syscall (TCP transmit, tap)"
        if any(k in txt for k in ("tcp_recvmsg", "sock_recvmsg", "vfs_read", "ksys_read",
                                  "do_iter_readv", "readv", "sock_read_iter", "recv")):
            return "receive syscall (TCP receive, copy)"
        if "handle_softirqs" in txt or "net_rx_action" in txt:
            return "softirq (network) in this thread"
        if "page_fault" in txt:
            return "page faults"
        if "schedule" in txt:
            return "preempted"
        return "kernel, other"
    if any(k in leaf for k in ("memmove", "memcpy", "memset")):
        return "user memcpy (payload, plugin copy)"
    if "plugin" in leaf:
        return "plugin code"
    if any(k in leaf for k in ("pthread_mutex", "lll_lock", "lll_unlock", "pthread_rwlock",
                               "pthread_cond")):
        return "user locks (pthread)"
    if "libevent" in leaf:
        return "libevent"
    if "vdso" in leaf:
        return "clock reads (vdso)"
    if "libc.so" in leaf or "ld-linux" in leaf or "libpthread" in leaf:
        return "libc, other"
    return "server code"


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    us = float(sys.argv[2]) if len(sys.argv) == 3 else 0.0
    text = subprocess.run(["perf", "script", "-i", sys.argv[1], "-F", "ip,sym,dso"],
                          capture_output=True, text=True, check=True).stdout
    count = collections.Counter()
    chain = []
    for line in text.splitlines() + [""]:
        f = line.split(None, 1)
        if len(f) == 2:
            chain.append(f[1])
        elif chain:
            count[parts_of(chain)] += 1
            chain = []
    n = sum(count.values())
    if not n:
        sys.exit("no samples in " + sys.argv[1])
    print("%d samples%s" % (n, ", %.1f µs per request" % us if us else ""))
    for part, k in count.most_common():
        print("  %-38s %5.1f%%%s" % (part, 100.0 * k / n,
                                      "  %5.1f µs" % (us * k / n) if us else ""))


if __name__ == "__main__":
    main()
