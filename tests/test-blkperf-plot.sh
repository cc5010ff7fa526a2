#!/usr/bin/env bash
# blkperf --plot: the chart has both panels with A and B in each, renders
# to a PNG in which both series' colours are drawn, and a missing gnuplot
# is one clear line before any measuring; a panel with nothing to draw (too
# few requests, iterations under a second) says so and the chart is drawn.
. "$(dirname "$0")/lib.sh"
[ -x "$BLKPERF" ] || skip "blkperf is not built (make blkperf)"
need nbdkit
need gnuplot
need rsvg-convert
PY=/usr/bin/python3

start_server nbdkit memory 1G
A=$URI
start_server nbdkit --filter=delay memory 1G rdelay=1ms
B=$URI

"$BLKPERF" compare -t RAND_READ -l 4 -i 2,2 --quiet --plot "$TMP/cmp.svg" "$A" "$B" \
  >"$TMP/cmp.txt" 2>"$TMP/cmp.err" || { cat "$TMP/cmp.err"; fail "compare --plot failed"; }
[ -s "$TMP/cmp.svg" ] || fail "no SVG written"
rsvg-convert -o "$TMP/cmp.png" "$TMP/cmp.svg" || fail "the SVG does not render"

# check SVG PNG: each side is a titled series in both panels with a drawn
# line, and the PNG has many pixels of each side's colour on white.
check_chart() {
  "$PY" - "$@" <<'EOF'
import re, struct, sys, zlib
svg, png, *sides = sys.argv[1:]
text = open(svg).read()
def fail(msg):
    print("FAIL: " + msg); sys.exit(1)
# gnuplot's SVG names each series of a panel <g id="gnuplot_plot_N?"> (the
# letter is the panel); the group holds its key entry (the title text) and
# its data path, or with an opaque key there are two groups of that id, the
# key's and the data's.  So: per id, the side's title in one of its groups
# and a path of at least three points (a key sample has two) in one of
# them, in both panels.
parts = re.split(r'<g id="gnuplot_plot_([0-9]+[a-z])"', text)
byid = {}
for i in range(1, len(parts) - 1, 2):
    byid.setdefault(parts[i], []).append(parts[i + 1])
colours = {"A": (0x1f, 0x77, 0xb4), "B": (0xd6, 0x27, 0x28)}
for side in sides:
    label = {"A": "A (before)", "B": "B (after)"}[side]
    panels = {sid[-1] for sid, bodies in byid.items()
              if any(label in b for b in bodies) and any(
                  len(re.findall(r"[ML][0-9.]+,[0-9.]+", d)) >= 3
                  for b in bodies for d in re.findall(r" d='([^']*)'", b))}
    if len(panels) < 2:
        fail("series %s is not drawn in both panels (%s)" % (label, sorted(panels)))
for title in ("Latency by percentile", "per second"):
    if title not in text:
        fail("panel title %r missing" % title)
# A minimal PNG reader (8-bit RGB/RGBA, not interlaced: what rsvg-convert writes).
data = open(png, "rb").read()
if data[:8] != b"\x89PNG\r\n\x1a\n":
    fail("not a PNG")
pos, idat, w = 8, b"", 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
        if depth != 8 or ctype not in (2, 6) or interlace:
            fail("unexpected PNG format %d/%d/%d" % (depth, ctype, interlace))
        bpp = 4 if ctype == 6 else 3
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
raw = zlib.decompress(idat)
stride = w * bpp
prev = bytearray(stride)
counts = {k: 0 for k in colours}
white = 0
for y in range(h):
    f = raw[y * (stride + 1)]
    line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    for x in range(0, stride, bpp):
        px = tuple(line[x:x + 3])
        if px == (255, 255, 255):
            white += 1
        for k, col in colours.items():
            if sum(abs(px[j] - col[j]) for j in range(3)) < 24:
                counts[k] += 1
    prev = line
print("PNG %dx%d: %s pixels of each side's colour, %.0f%% white" % (
    w, h, counts, 100.0 * white / (w * h)))
if white > 0.995 * w * h:
    fail("the PNG is blank")
for side in sides:
    if counts[side] < 300:
        fail("side %s hardly appears in the PNG (%d pixels)" % (side, counts[side]))
EOF
}
check_chart "$TMP/cmp.svg" "$TMP/cmp.png" A B || fail "compare chart incomplete"

# A single run charts A alone, over its iterations.
"$BLKPERF" -t STREAM_READ -l 4 -i 2,2 --quiet --plot "$TMP/run.svg" --label "memory plugin" \
  "$A" >/dev/null || fail "run --plot failed"
grep -q "A (before): memory plugin" "$TMP/run.svg" || fail "--label not on the chart"
rsvg-convert -o "$TMP/run.png" "$TMP/run.svg" || fail "the single-run SVG does not render"
check_chart "$TMP/run.svg" "$TMP/run.png" A || fail "single-run chart incomplete"

# Iterations shorter than a second (-n) sample no rate per second: the
# chart is still drawn, its lower panel saying so (gnuplot refused the
# empty plot before, and blkperf exited 1).
"$BLKPERF" -t RAND_READ -b 4k -n 50 -i 2,2 --quiet --plot "$TMP/short.svg" "$A" >/dev/null \
  2>"$TMP/short.err" || { cat "$TMP/short.err"; fail "--plot with sub-second iterations failed"; }
grep -q "no iteration lasted a whole second" "$TMP/short.svg" || fail "short iterations: no note on the chart"
rsvg-convert -o "$TMP/short.png" "$TMP/short.svg" || fail "the short-iteration SVG does not render"
# One request: no percentile has enough behind it, so the latency panel
# says so too (gnuplot refused the empty curve, and blkperf exited 1).
"$BLKPERF" -t RAND_READ -b 4k -n 1 -i 1 --quiet --plot "$TMP/one.svg" "$A" >/dev/null \
  2>"$TMP/one.err" || { cat "$TMP/one.err"; fail "--plot with one request failed"; }
grep -q "too few requests for any percentile" "$TMP/one.svg" || fail "one request: no note on the chart"
grep -q "Latency by percentile" "$TMP/one.svg" || fail "one request: the latency panel lost its title"
rsvg-convert -o "$TMP/one.png" "$TMP/one.svg" || fail "the one-request SVG does not render"

# No gnuplot on PATH: one line, status 1, before connecting anywhere.
mkdir -p "$TMP/bin"
for t in cat rm; do ln -sf "$(command -v $t)" "$TMP/bin/$t"; done
rc=0
dead_port
PATH="$TMP/bin" "$BLKPERF" -l 1 --plot "$TMP/x.svg" "nbd://127.0.0.1:$DEAD_PORT" \
  >"$TMP/nognu.out" 2>"$TMP/nognu.err" || rc=$?
cat "$TMP/nognu.err"
[ $rc -eq 1 ] || fail "missing gnuplot: exit $rc, expected 1"
[ "$(wc -l <"$TMP/nognu.err")" -eq 1 ] || fail "missing gnuplot: not one line"
grep -q "needs gnuplot, which is not installed" "$TMP/nognu.err" || fail "missing gnuplot: unclear error"
# An unwritable chart path is refused up front too.
rc=0
"$BLKPERF" -l 1 --plot /nonexistent/dir/x.svg "$A" >/dev/null 2>"$TMP/nodir.err" || rc=$?
[ $rc -eq 1 ] && grep -q "cannot write /nonexistent/dir/x.svg" "$TMP/nodir.err" \
  || fail "unwritable --plot path not refused"

echo "all plot checks passed"
