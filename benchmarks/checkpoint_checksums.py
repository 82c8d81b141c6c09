#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""What checkpoint checksums cost: ``engine.load_checkpoint`` of one ZeRO checkpoint with its files verified against
their size and CRC32 records (the default) and unverified, and ``save_checkpoint`` with and without writing the
records, in turns on one CPU rank; and the CRC32 of the tag's files alone, per GiB.

    python benchmarks/checkpoint_checksums.py [--params 110e6] [--stage 2] [--pairs 3]
"""

import glob
import os
import statistics
import tempfile

from toolkit import tables
from safe_load import one_rank_engine, timed


def main():
    args, engine, count = one_rank_engine(__doc__.splitlines()[0])
    from deepspeed.checkpoint import integrity
    # Counted, so that the table shows the verified loads did verify: every file, once.
    crc_of, verified_files = integrity.file_crc32, []
    integrity.file_crc32 = lambda path: verified_files.append(path) or crc_of(path)
    loads = {"verified (default)": [], "unverified": []}
    saves = {"records written (default)": [], "no records": []}
    crc = []
    with tempfile.TemporaryDirectory(prefix="ds-checksums-") as root:
        engine.save_checkpoint(root, tag="t")
        files = sorted(glob.glob(os.path.join(root, "t", "*.pt")))
        size = sum(os.path.getsize(path) for path in files)
        for _ in range(args.pairs):
            with integrity.verify_checksums(False):
                loads["unverified"].append(timed(lambda: engine.load_checkpoint(root, tag="t")))
            verified_files.clear()
            loads["verified (default)"].append(timed(lambda: engine.load_checkpoint(root, tag="t")))
            checked = {os.path.normpath(path) for path in verified_files}
            assert checked == {os.path.normpath(path) for path in files}, f"a verified load checked {checked}"
            file_loads = len(verified_files)
            crc.append(timed(lambda: [crc_of(path) for path in files]))
        for turn in range(args.pairs):
            # Each first in turn: a save waits on the disk's writeback of the one before it.
            for records in (False, True) if turn % 2 == 0 else (True, False):
                engine.checkpoint_engine.checksums = records
                name = "records written (default)" if records else "no records"
                saves[name].append(timed(lambda: engine.save_checkpoint(root, tag="s")))
    gib = size / 2**30
    print(f"{count / 1e6:.0f}M parameters, ZeRO-{args.stage}, {len(files)} files, {gib:.2f} GiB; "
          f"{args.pairs} of each, in turns; each verified load checked all {len(files)} files "
          f"({file_loads} file loads); "
          f"CRC32 alone {statistics.median(crc) / gib:.2f} s/GiB")
    for title, times, base in (("load_checkpoint", loads, "unverified"), ("save_checkpoint", saves, "no records")):
        reference = statistics.median(times[base])
        rows = [[name, " ".join(f"{t:.2f}" for t in values), f"{statistics.median(values) / reference:.2f}"]
                for name, values in times.items()]
        print("\n".join(tables.table([title, "seconds", f"median / {base}"], rows, right=(f"median / {base}", ))))


if __name__ == "__main__":
    main()
