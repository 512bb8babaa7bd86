#!/usr/bin/env python3
"""Could a readahead list be guessed from the libraries' ELF sections, for the
launch that has no recorded list yet (a fresh machine, a rebuilt worker)?

  readahead_guessed_list.py analyse LIST              which sections the recorded pages fall in, per section name
  readahead_guessed_list.py write LIST HEURISTIC OUT  a list with LIST's key and files, ranges from HEURISTIC

Heuristics (every allocated section with file contents, less):
  data:    executable sections, .nv_fatbin / __nv_relfatbin, .eh_frame, .gcc_except_table
  nofat:   executable sections, .nv_fatbin / __nv_relfatbin
  data_ro: `data` less .rodata
  dyn:     only what the dynamic loader reads whole at load time: the symbol tables, their hashes and
           versions, the relocations, and what they relocate (.data.rel.ro, .got, .got.plt), the PLT
"""
import struct
import sys
from collections import defaultdict

SHF_ALLOC, SHF_EXEC, SHT_NOBITS = 0x2, 0x4, 8
FAT = {".nv_fatbin", "__nv_relfatbin"}
UNWIND = {".eh_frame", ".gcc_except_table"}
DYN = {".dynsym", ".dynstr", ".gnu.hash", ".hash", ".gnu.version", ".gnu.version_d", ".gnu.version_r",
       ".rela.dyn", ".rela.plt", ".relr.dyn", ".data.rel.ro", ".got", ".got.plt", ".plt", ".plt.got",
       ".plt.sec", ".init_array", ".fini_array", ".dynamic"}
HEADER = 64 << 10  # the ELF and program headers, the loader reads them first


def sections(path):
    with open(path, "rb") as f:
        h = f.read(64)
        if h[:4] != b"\x7fELF" or h[4] != 2:
            return []
        shoff, = struct.unpack_from("<Q", h, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", h, 0x3A)
        f.seek(shoff)
        raw = f.read(shentsize * shnum)
        hdrs = [struct.unpack_from("<IIQQQQIIQQ", raw, i * shentsize) for i in range(shnum)]
        stroff, strsize = hdrs[shstrndx][4], hdrs[shstrndx][5]
        f.seek(stroff)
        names = f.read(strsize)
    out = []
    for name, typ, flags, _addr, off, size, *_ in hdrs:
        if not flags & SHF_ALLOC or typ == SHT_NOBITS or size == 0:
            continue
        n = names[name:names.index(b"\0", name)].decode()
        out.append((n, flags, off, size))
    return out


def parse_list(path):
    key, files = None, []
    for line in open(path):
        p = line.split()
        if not p:
            continue
        if p[0] == "key":
            key = line.rstrip("\n")
        elif p[0] == "file":
            files.append([int(p[1]), int(p[2]), line.split(" ", 3)[3].rstrip("\n"), []])
        elif p[0] == "range":
            files[-1][3].append((int(p[1]), int(p[2])))
    return key, files


def overlap(ranges, off, size):
    total = 0
    for o, l in ranges:
        a, b = max(o, off), min(o + l, off + size)
        if b > a:
            total += b - a
    return total


def pick(secs, heuristic):
    for n, flags, off, size in secs:
        if heuristic == "dyn":
            if n in DYN:
                yield off, size
            continue
        if flags & SHF_EXEC or (heuristic != "all" and n in FAT):
            continue
        if heuristic in ("data", "data_ro") and n in UNWIND:
            continue
        if heuristic == "data_ro" and n == ".rodata":
            continue
        yield off, size


def merge(ranges, gap=64 << 10):
    out = []
    for o, l in sorted(ranges):
        if out and o <= out[-1][0] + out[-1][1] + gap:
            end = max(out[-1][0] + out[-1][1], o + l)
            out[-1] = (out[-1][0], end - out[-1][0])
        else:
            out.append((o, l))
    return out


def guess(path, size, heuristic):
    try:
        secs = sections(path)
    except OSError:
        return []
    if not secs:
        return [(0, size)] if size <= (1 << 20) else []
    return merge([(0, min(HEADER, size))] + list(pick(secs, heuristic)))


def analyse(list_path):
    _, files = parse_list(list_path)
    by_name = defaultdict(lambda: [0, 0])  # name -> [section bytes, recorded bytes in it]
    rec_total = sum(l for f in files for _, l in f[3])
    per_file = []
    for size, _mt, path, ranges in files:
        try:
            secs = sections(path)
        except OSError:
            secs = []
        inside = 0
        for n, flags, off, sz in secs:
            k = n + (" (x)" if flags & SHF_EXEC else "")
            r = overlap(ranges, off, sz)
            by_name[k][0] += sz
            by_name[k][1] += r
            inside += r
        rec = sum(l for _, l in ranges)
        per_file.append((rec, size, path, rec - inside))
    mib = 1 << 20
    print(f"recorded: {len(files)} files, {rec_total / mib:.1f} MiB, of {sum(f[0] for f in files) / mib:.1f} MiB of files")
    print("| section | MiB in the files | MiB recorded in it | share of the recorded |")
    print("| --- | --- | --- | --- |")
    for k, (sz, r) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:18]:
        print(f"| {k} | {sz / mib:.1f} | {r / mib:.1f} | {100 * r / max(rec_total, 1):.1f}% |")
    print("| file | MiB recorded | MiB of the file | recorded outside sections |")
    print("| --- | --- | --- | --- |")
    for rec, size, path, outside in sorted(per_file, reverse=True)[:12]:
        print(f"| {path.rsplit('/', 1)[-1]} | {rec / mib:.1f} | {size / mib:.1f} | {outside / mib:.1f} |")
    print("| heuristic | MiB to read | recorded MiB it covers | recall |")
    print("| --- | --- | --- | --- |")
    for h in ("dyn", "data", "data_ro", "nofat", "all"):
        want = cov = 0
        for size, _mt, path, ranges in files:
            g = guess(path, size, h)
            want += sum(l for _, l in g)
            cov += sum(overlap(ranges, o, l) for o, l in g)
        print(f"| {h} | {want / mib:.1f} | {cov / mib:.1f} | {100 * cov / max(rec_total, 1):.1f}% |")


def write(list_path, heuristic, out):
    key, files = parse_list(list_path)
    lines = ["stagehand-readahead 1", key]
    for size, mt, path, _ in files:
        lines.append(f"file {size} {mt} {path}")
        lines += [f"range {o} {l}" for o, l in guess(path, size, heuristic)]
    open(out, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "analyse":
        analyse(sys.argv[2])
    else:
        write(sys.argv[2], sys.argv[3], sys.argv[4])
