"""Writes the TensorRT delegate blobs of a .pte, with their named data, to files (for launch_check.py
on the device, which has no ExecuTorch).

    python runtime/tools/extract_blobs.py out/moe_policy.pte OUTDIR [FILE.ptd ...]

Writes OUTDIR/<method>_<i>.blob, one per et-trt delegate in program order, and its named data
(weights, kernel images, engines) under OUTDIR/<method>_<i>.named/, one file per key (the key is
the file's path there).
"""

from __future__ import annotations

import pathlib
import sys

from et_trt_backend.serialization.pte import read_partitions


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    pte, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    partitions = read_partitions(pte.read_bytes(), sys.argv[3:], data_dir=pte.parent)
    if not partitions:
        sys.exit(f"{pte} has no et-trt delegate")
    for i, partition in enumerate(partitions):
        path = out / f"{partition.delegate.plan}_{i}.blob"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(partition.delegate.data)
        for data in partition.contents.named_data():
            file = path.with_suffix(".named") / data.key
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_bytes(data.bytes())
        print(f"{path} ({len(partition.delegate.data)} bytes, {len(partition.contents.named_data())} named data)")


if __name__ == "__main__":
    main()
