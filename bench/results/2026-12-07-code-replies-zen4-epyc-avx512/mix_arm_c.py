"""Arm C's data: arm A's (library text + chat) with arm B's code completions appended
(shards linked, renumbered after A's)."""

import json
import os
import sys
from collections import Counter
from pathlib import Path

a, b, dst = (Path(arg) for arg in sys.argv[1:4])
ma = json.loads((a / "manifest.json").read_text())
mb = json.loads((b / "manifest.json").read_text())
assert ma["fingerprint"] == mb["fingerprint"] and ma["length"] == mb["length"]
out = {**ma, "shards": []}
for src, m, keep in ((a, ma, None), (b, mb, "code")):
    for shard in m["shards"]:
        if keep and shard["source"] != keep:
            continue
        name = f"shard-{len(out['shards']):05d}.pt"
        os.symlink(src / shard["file"], dst / name)
        out["shards"].append({**shard, "file": name})
(dst / "manifest.json").write_text(json.dumps(out, indent=1))
if (a / "unseen-replies-int4.json").exists():
    os.symlink(a / "unseen-replies-int4.json", dst / "unseen-replies-int4.json")
print(Counter(s["source"] for s in out["shards"]))
