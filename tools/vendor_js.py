#!/usr/bin/env python3
"""Copy the socket.io browser client from node_modules/ into static/vendor/.

Usage (from anywhere; paths are resolved relative to the repository root):

    npm install                  # installs the exact version pinned in package.json
    python tools/vendor_js.py    # copies dist/socket.io.min.js and LICENSE

The version is read from node_modules/socket.io-client/package.json and put in
the file names (socket.io-<version>.min.js, LICENSE-socket.io-client-<version>.txt),
so the templates must be updated when the pin in package.json changes.
Vendored files of other versions are removed.

    python tools/vendor_js.py --check

only verifies that static/vendor/ holds byte-identical copies (exit status 1 if not).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "node_modules" / "socket.io-client"
VENDOR = ROOT / "static" / "vendor"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="verify only; copy nothing")
    args = parser.parse_args(argv)

    manifest = PKG / "package.json"
    if not manifest.is_file():
        print(f"{manifest} not found: run `npm install` in {ROOT} first", file=sys.stderr)
        return 2
    version = json.loads(manifest.read_text(encoding="utf-8"))["version"]

    pairs = [
        (PKG / "dist" / "socket.io.min.js", VENDOR / f"socket.io-{version}.min.js"),
        (PKG / "LICENSE", VENDOR / f"LICENSE-socket.io-client-{version}.txt"),
    ]

    if args.check:
        stale = [dst for src, dst in pairs if not dst.is_file() or dst.read_bytes() != src.read_bytes()]
        for dst in stale:
            print(f"out of date: {dst.relative_to(ROOT)}", file=sys.stderr)
        return 1 if stale else 0

    VENDOR.mkdir(parents=True, exist_ok=True)
    keep = {dst.name for _, dst in pairs}
    for old in [*VENDOR.glob("socket.io-*.min.js"), *VENDOR.glob("LICENSE-socket.io-client-*.txt")]:
        if old.name not in keep:
            old.unlink()
            print(f"removed {old.relative_to(ROOT)}")
    for src, dst in pairs:
        shutil.copyfile(src, dst)
        print(f"{src.relative_to(ROOT)} -> {dst.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
