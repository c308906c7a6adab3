"""Write a synthetic model of N shards into a Hugging Face hub cache, on a simulated node.

Fed to ``python3 -`` inside a node (standard library only) by the weight fault tests and the
weight-sync benchmark:  python3 - <repo dir> <revision> <shards> <shard bytes>

Blobs are named by their sha256 as huggingface_hub names LFS files; snapshot links are relative;
refs/main holds the revision.
"""

import hashlib
import os
import sys

repo, rev, shards, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
snap = os.path.join(repo, "snapshots", rev)
for d in ("blobs", "refs", snap):
    os.makedirs(os.path.join(repo, d), exist_ok=True)
for i in range(shards):
    data = (hashlib.sha256(b"shard%d" % i).digest() * (size // 32 + 1))[:size]
    name = hashlib.sha256(data).hexdigest()
    with open(os.path.join(repo, "blobs", name), "wb") as f:
        f.write(data)
    link = os.path.join(snap, f"model-{i:05d}.safetensors")
    if not os.path.lexists(link):
        os.symlink("../../blobs/" + name, link)
with open(os.path.join(repo, "refs", "main"), "w") as f:
    f.write(rev)
