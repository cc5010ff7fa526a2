#!/usr/bin/python3
"""The server's import graph has no circles: no file of server/ calls into
a file that calls back into it, directly or through others (read from the symbols each object file
defines and uses, so macros and headers cannot hide a call).  Where a
lower file must reach up (the shard to its connections, connections and
shards to the live restart), it goes through function pointers the upper
file registers (struct shard_conn_ops, the restart hooks), which no
symbol table shows as a call.  KNOWN lists pairs allowed to call both
ways (none now); a listed pair that no longer does fails too, so the
list shrinks with the code."""

import glob
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
from blkdtest import TOP, check, fail, ok, skip  # noqa: E402

# Pairs that still call each other: none.
KNOWN = set()

# The objects of the build that made ./blkd (the Makefile keeps one
# .flavour stamp, in that build's object tree).
stamps = glob.glob(os.path.join(TOP, "build", "*", ".flavour"))
if not stamps:
    skip("no build tree with a .flavour stamp (make all first)")
objdir = os.path.dirname(stamps[0])
# One object per source (an object whose source is gone is left over
# from an older tree: not part of the server any more).
srcs = sorted(glob.glob(os.path.join(TOP, "server", "*.c")))
objs = [os.path.join(objdir, "server", os.path.basename(s)[:-2] + ".o") for s in srcs]
missing = [o for o in objs if not os.path.exists(o)]
if missing:
    fail("no %s: rebuild (make all)" % ", ".join(missing))

defines, uses = {}, {}
for o in objs:
    name = os.path.basename(o)[:-2]
    out = subprocess.run(["nm", o], capture_output=True, text=True, check=True).stdout
    d, u = set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) == 3 and f[1] in "TDBRCV":
            d.add(f[2])
        elif len(f) == 2 and f[0] == "U":
            u.add(f[1])
    defines[name], uses[name] = d, u
owner = {sym: name for name, d in defines.items() for sym in d}
calls = {name: {owner[s] for s in u if s in owner and owner[s] != name}
         for name, u in uses.items()}

both_ways = set()
for a, targets in calls.items():
    for b in targets:
        if a in calls.get(b, ()):
            both_ways.add(frozenset((a, b)))

for pair in sorted(both_ways - KNOWN, key=sorted):
    a, b = sorted(pair)
    ab = sorted(s for s in uses[a] if owner.get(s) == b)
    ba = sorted(s for s in uses[b] if owner.get(s) == a)
    check(False, "%s.c and %s.c call each other" % (a, b),
          "%s uses %s; %s uses %s" % (a, ", ".join(ab), b, ", ".join(ba)))
# Longer circles too (a calls b calls c calls a): the files of each
# strongly connected component of more than one file, found by Tarjan's
# algorithm, iterative so no recursion limit applies.
def components(graph):
    index, low, on, stack, out, n = {}, {}, set(), [], [], 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = n
        n += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = n
                    n += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


# The known pairs' calls both ways are allowed; any other circle fails.
allowed = {(a, b) for p in KNOWN for a in p for b in p if a != b}
graph = {a: {b for b in t if (a, b) not in allowed} for a, t in calls.items()}
for comp in components(graph):
    if len(comp) > 1:
        inside = set(comp)
        edges = "; ".join("%s -> %s" % (a, ", ".join(sorted(graph[a] & inside)))
                          for a in comp)
        check(False, "a circle through %s" % ", ".join(f + ".c" for f in comp), edges)

present = {p for p in KNOWN if p <= set(calls)}
for pair in sorted(present - both_ways, key=sorted):
    check(False, "%s.c and %s.c no longer call each other: drop them from KNOWN"
          % tuple(sorted(pair)))
if present:
    ok("%d server files: no circle but the %d known pairs (%s)"
       % (len(objs), len(present),
          "; ".join("/".join(sorted(p)) for p in sorted(present, key=sorted))))
else:
    ok("%d server files: no circle of calls" % len(objs))
