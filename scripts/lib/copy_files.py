"""What scripts/make-offgrid.py and scripts/make-offgrid-gemma.py share about the copies they
write: the seeded random rotation, where a copy goes, when an existing one is reused (its
JSON record equals the request), and writing it under a temporary name so that a copy whose
check failed, or a run that was killed, never leaves a file that looks finished.
"""
import json
import os
import sys

import numpy as np


def random_orthogonal(rng, d):
    """A Haar-distributed d x d orthogonal matrix: QR of a seeded Gaussian matrix, column
    signs fixed by R's diagonal."""
    g = rng.standard_normal((d, d))
    q, r = np.linalg.qr(g)
    return q * np.sign(np.diag(r))[None, :]


def copy_path(source, name, default_suffix):
    """<name>-F32.gguf beside the source, name defaulting to the source's name without .gguf
    and -F32, plus `default_suffix`."""
    base = os.path.basename(source)
    stem = base[: -len(".gguf")] if base.endswith(".gguf") else base
    if stem.endswith("-F32"):
        stem = stem[: -len("-F32")]
    return os.path.join(os.path.dirname(os.path.abspath(source)), f"{name or stem + default_suffix}-F32.gguf")


def source_identity(source):
    st = os.stat(source)
    return {"source": os.path.basename(source), "source_size": st.st_size, "source_mtime_ns": st.st_mtime_ns}


def reuse(out, record, measured=()):
    """True (and says so) when `out` exists with a record equal to `record`, keys in
    `measured` (figures the making recorded, not asked for) left out of the comparison."""
    path = out + ".json"
    if not (os.path.isfile(out) and os.path.isfile(path)):
        return False
    try:
        with open(path) as f:
            old = json.load(f)
    except (OSError, ValueError):
        old = None
    if isinstance(old, dict) and {k: v for k, v in old.items() if k not in measured} == record:
        print(f"present: {out}", file=sys.stderr)
        return True
    print(f"remaking {out}: its record {path} differs from this request", file=sys.stderr)
    return False


def write_checked(out, record, write, check=None):
    """Writes the copy through `write(tmp_path)`, runs `check(tmp_path)` (which exits on a
    failure), then renames the file and its record into place; nothing is left otherwise."""
    tmp = f"{out}.tmp.{os.getpid()}"
    tmp_record = f"{out}.json.tmp.{os.getpid()}"
    try:
        write(tmp)
        if check is not None:
            check(tmp)
        with open(tmp_record, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
        os.replace(tmp, out)
        os.replace(tmp_record, out + ".json")
    finally:
        for p in (tmp, tmp_record):
            if os.path.exists(p):
                os.remove(p)
