#!/usr/bin/env bash
# Does it cost a hot read that a block's payload starts 4 KiB into its file? Without tierkv's
# read path: a small C reader (one pread per block into one page-aligned buffer, random order,
# every file open) reads N block files a store wrote (payload at 4096, hard-linked into a flat
# directory) and N files of the same payload size holding it at offset 0, interleaved round by
# round; the median of the per-round ratios (store's files / offset-0 files).
#
# usage: tools/research/payload-offset-probe.sh [ROUNDS] [BS] [N] [DIR]   (defaults: 12 2m 256 /var/tmp)
set -euo pipefail
cd "$(dirname "$0")/../.."
. tools/bench-common.sh
ROUNDS=${1:-12}; BS=${2:-2m}; N=${3:-256}; BASE=${4:-/var/tmp}
build_bin tierkv-bench
bytes=$(size_bytes "$BS")
W=$(mktemp -d "$BASE/tierkv-offset.XXXXXX"); trap 'rm -rf "$W"' EXIT
machine_line "$W"
cat > "$W/hot.c" <<'C'
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
/* hot DIR N BS OFFSET PASSES: MiB/s of PASSES random-order passes of pread(BS at OFFSET) over
   DIR/f0..f(N-1), after one untimed pass; exits 1 on a short read. */
int main(int argc, char **argv) {
  if (argc != 6) return 2;
  int n = atoi(argv[2]), passes = atoi(argv[5]);
  size_t bs = strtoull(argv[3], 0, 10);
  off_t off = strtoll(argv[4], 0, 10);
  int *fds = malloc(n * sizeof *fds), *ord = malloc(n * sizeof *ord);
  char p[4096];
  for (int i = 0; i < n; i++) {
    snprintf(p, sizeof p, "%s/f%d", argv[1], i);
    if ((fds[i] = open(p, O_RDONLY)) < 0) { perror(p); return 1; }
    ord[i] = i;
  }
  void *buf;
  if (posix_memalign(&buf, 4096, bs)) return 1;
  memset(buf, 0xff, bs);
  for (int i = 0; i < n; i++)
    if (pread(fds[i], buf, bs, off) != (ssize_t)bs) { fprintf(stderr, "short read f%d\n", i); return 1; }
  srand(1);
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (int l = 0; l < passes; l++) {
    for (int i = n - 1; i > 0; i--) { int j = rand() % (i + 1), t = ord[i]; ord[i] = ord[j]; ord[j] = t; }
    for (int i = 0; i < n; i++)
      if (pread(fds[ord[i]], buf, bs, off) != (ssize_t)bs) { fprintf(stderr, "short read\n"); return 1; }
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  double s = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
  printf("%.0f\n", (double)bs * n * passes / s / 1048576);
  return 0;
}
C
cc -O2 -o "$W/hot" "$W/hot.c"
$B --dir "$W/s" --rw write --bs "$BS" --nblocks "$N" --output-format json >/dev/null
link_block_files "$W/s" "$W/store" "$bytes" "$N"
mkdir "$W/zero"
# Each written with one write() of the whole payload, as a put writes its block (one pwritev):
# the page cache then holds it in large folios. Files written in small pieces (head -c, 8 KiB
# writes) read back at about half this speed on this VM.
python3 - "$W/zero" "$N" "$bytes" <<'PY'
import os, sys
d, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    fd = os.open(f"{d}/f{i}", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    assert os.write(fd, os.urandom(size)) == size
    os.close(fd)
PY
sync
passes=$(( (6 << 30) / (bytes * N) )); [ "$passes" -lt 1 ] && passes=1
echo "bs=$BS files=$N passes=$passes per round; MiB/s: payload at 0, store's files (payload at 4096)"
for r in $(seq "$ROUNDS"); do
  z=$("$W/hot" "$W/zero" "$N" "$bytes" 0 "$passes")
  s=$("$W/hot" "$W/store" "$N" "$bytes" 4096 "$passes")
  echo "$z $s"
done | tee "$W/rows"
python3 - "$W/rows" <<'PY'
import statistics, sys
rows = [[float(x) for x in l.split()] for l in open(sys.argv[1]) if l.strip()]
r = [s / z for z, s in rows]
print(f"store's files / offset 0: median {statistics.median(r):.2f}x (per round {min(r):.2f}-{max(r):.2f}x, {len(r)} rounds)")
PY
