#!/usr/bin/env python3
"""Rebuild datasets/wikitext-2-raw/wiki.test.raw from the Hugging Face hub (needs a network
and the `datasets` package) and check it against the manifest's SHA-256.

The file is already shipped with the repository; this is for checking it, or for building
other splits the same way (one dataset row per line, CRLF line endings)."""
import hashlib
import pathlib
import sys
import tomllib

root = pathlib.Path(__file__).resolve().parent.parent / "datasets"
manifest = tomllib.loads((root / "wikitext-2-raw.toml").read_text())
try:
    from datasets import load_dataset
except ImportError:
    sys.exit("error: needs the `datasets` package: pip install datasets")
rows = load_dataset(manifest["hub_dataset"], manifest["hub_config"], split=manifest["hub_split"])
# Rows carry their own trailing "\n"; empty rows are blank separators the shipped file omits.
# (Not verifiable without a network here: the SHA-256 check below refuses a mismatch.)
data = "".join(r["text"] for r in rows if r["text"]).replace("\n", "\r\n").encode("utf-8")
digest = hashlib.sha256(data).hexdigest()
out = root / manifest["file"]
if digest != manifest["sha256"]:
    sys.exit(f"error: rebuilt text has sha256 {digest}, manifest says {manifest['sha256']}; not written")
tmp = out.with_suffix(".tmp")
tmp.write_bytes(data)
tmp.replace(out)
print(f"{out}: {len(data)} bytes, sha256 ok")
