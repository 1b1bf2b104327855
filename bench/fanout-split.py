#!/usr/bin/env python3
"""One change's way to every simulated node, from bench/fanout-trace.sh's dump.

usage: fanout-split.py DUMP.txt BENCH_PID BRAIN_PID CLIENTS_PID

Per change (from the benchmark's rename to the next), in ms after the rename: the brain's
hub apply (if the `applyin` uprobe was recorded), its first, middle and last change-set write
(`writev` > 40 bytes), the span first → last write and how much of it were gaps of more than
2 ms in which no brain thread wrote anything (the brain off the CPUs), the nodes' last read
and their last `sync` line. Medians and maxima at the end. A change the recording cut short (fewer
brain writes than 0.9 × the nodes' reads, or no read) is left out.
"""
import re
import statistics
import sys

dump = sys.argv[1]
bench, brain, clients = (int(a) for a in sys.argv[2:5])
line = re.compile(r'^\s*(\d+)/(\d+)\s+([\d.]+):\s+(\S+):\s*(.*)$')
events = []
with open(dump, errors='replace') as f:
    for text in f:
        m = line.match(text)
        if m:
            events.append((float(m[3]), int(m[1]), m[4], m[5]))
events.sort()
starts = [t for t, pid, name, _ in events if pid == bench and 'rename' in name]
cols = ['apply', 'w_first', 'w_mid', 'w_last', 'span', 'gaps', 'r_last', 'sync_last']
print('change ' + ' '.join(f'{c:>9}' for c in cols) + '  writes reads')
rows = []
for k, t0 in enumerate(starts):
    t1 = starts[k + 1] if k + 1 < len(starts) else float('inf')
    window = [e for e in events if t0 <= e[0] < t1]
    ms = lambda t: (t - t0) * 1000.0
    apply = [t for t, pid, name, _ in window if pid == brain and 'applyin' in name]
    writes = [t for t, pid, name, _ in window if pid == brain and 'writev' in name]
    reads = [t for t, pid, name, _ in window if pid == clients and 'recvfrom' in name]
    syncs = [t for t, pid, name, _ in window if pid == clients and 'sys_enter_write' in name]
    if len(writes) < 10 or (reads and len(writes) < 0.9 * max(len(reads), 1)) or not reads:
        continue
    gaps = sum(b - a for a, b in zip(writes, writes[1:]) if b - a > 0.002)
    row = {
        'apply': ms(apply[0]) if apply else float('nan'),
        'w_first': ms(writes[0]),
        'w_mid': ms(writes[len(writes) // 2]),
        'w_last': ms(writes[-1]),
        'span': (writes[-1] - writes[0]) * 1000.0,
        'gaps': gaps * 1000.0,
        'r_last': ms(reads[-1]) if reads else float('nan'),
        'sync_last': ms(syncs[-1]) if syncs else float('nan'),
    }
    rows.append(row)
    print(f'{k:6d} ' + ' '.join(f'{row[c]:9.1f}' for c in cols) + f'  {len(writes):6d} {len(reads):5d}')
for c in cols:
    v = [r[c] for r in rows if r[c] == r[c]]
    if v:
        print(f'{c:>9}: median {statistics.median(v):6.1f} ms, mean {statistics.mean(v):6.1f}, max {max(v):6.1f}')
