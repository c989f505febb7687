"""Append arm A's chat-builtin shards to arm B's data directory (renumbered after B's own).

python append_chat.py A_DATA_DIR B_DATA_DIR
"""

import json
import shutil
import sys
from collections import Counter
from pathlib import Path

src, dst = Path(sys.argv[1]), Path(sys.argv[2])
ms = json.loads((src / "manifest.json").read_text())
md = json.loads((dst / "manifest.json").read_text())
assert ms["fingerprint"] == md["fingerprint"] and ms["length"] == md["length"]
for shard in ms["shards"]:
    if shard["source"] != "chat-builtin":
        continue
    name = f"shard-{len(md['shards']):05d}.pt"
    shutil.copyfile(src / shard["file"], dst / name)
    md["shards"].append({**shard, "file": name})
(dst / "manifest.json").write_text(json.dumps(md, indent=1))
shutil.copyfile(src / "unseen-replies-int4.json", dst / "unseen-replies-int4.json")
print(Counter(s["source"] for s in md["shards"]))
