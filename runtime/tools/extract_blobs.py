"""Writes the TensorRT delegate blobs of a .pte to files (for launch_check.py on the device).

    python runtime/tools/extract_blobs.py out/moe_policy.pte OUTDIR

Writes OUTDIR/<method>_<i>.blob, one per et-trt delegate, in program order.
"""

from __future__ import annotations

import pathlib
import sys

from et_trt_backend.runtime import delegate_blobs


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    out = pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    blobs = delegate_blobs(sys.argv[1])
    if not blobs:
        sys.exit(f"{sys.argv[1]} has no et-trt delegate")
    for i, (method, blob) in enumerate(blobs):
        path = out / f"{method}_{i}.blob"
        path.write_bytes(blob)
        print(f"{path} ({len(blob)} bytes)")


if __name__ == "__main__":
    main()
