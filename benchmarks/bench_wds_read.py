"""Reading images from WebDataset tar shards vs a folder (same images, same process): bytes, keys, decode.

    python benchmarks/bench_wds_read.py [--n 2000] [--per-shard 500] [--threads 2] [--s3]

Stages, each timed on the same COCO-sized JPEGs (640x480, ~100 kB) in a folder and in tar shards, warm page
cache (one untimed pass first), best of ``--repeat``:

- ``keys``: what the driver does before any encoding under ``--key-by content``: folder = read + hash every
  file (``ItemTable.keys``, threads); tar = one streaming scan per shard (``scan_shard``: members, captions
  and content hashes in one pass; its cache disabled);
- ``keys (id)``: ``--key-by id`` with the identities recorded: ``stat`` per file vs per shard;
- ``read``: a decode stage's byte reads for batches of 256 (``urls.read_many``: one range request per run of
  members vs one open/read per file);
- ``decode``: the whole decode stage (``DecodeStage``, Pillow, ViT-B/32 preprocessing) per batch.

With ``--s3`` the shards are also served by moto's S3 server on 127.0.0.1 (a pure-Python server: it bounds
the figure, a real object store's latency and bandwidth differ) and read through s3fs. Prints one table,
writes ``benchmarks/results/wds_read.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from hardrank import urls
from hardrank.embed import DecodeStage, EmbedJob
from hardrank.inputs import read_samples, scan_shard, write_shard
from hardrank.items import ImageRef, ItemTable
from hardrank.jobs.bench.inputs import coco_like_jpegs
from hardrank.jobs.bench.timing import best_of
from hardrank.store.idkeys import IdIndex, table_keys

PREPROCESS = {"size": 224, "mode": "RGB", "mean": [0.48145466, 0.4578275, 0.40821073],
              "std": [0.26862954, 0.26130258, 0.27577711], "interpolation": "bicubic", "resize_mode": "shortest",
              "fill_color": 0}


def _shards(paths: list[str], out: Path, per_shard: int) -> str:
    out.mkdir(parents=True, exist_ok=True)
    n = -(-len(paths) // per_shard)
    for s in range(n):
        target = out / f"{s:05d}.tar"
        if not target.exists():
            write_shard(str(target), [(f"{i:09d}", {"jpg": Path(paths[i]).read_bytes(), "txt": b"a caption"})
                                      for i in range(s * per_shard, min(len(paths), (s + 1) * per_shard))])
    return str(out / f"{{00000..{n - 1:05d}}}.tar")


def _measure(refs: list[ImageRef], shards: list[str] | None, threads: int, repeat: int, batch: int) -> dict:
    n = len(refs)
    out = {}
    if shards is None:
        def keys():
            t = ItemTable("image")
            t.add_many(refs)
            t.keys(threads)
    else:
        def keys():
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(lambda s: scan_shard(s, True, cache=False), shards))
    out["keys"] = n / best_of(keys, repeat=repeat)
    store = Path(os.environ["HARDRANK_CACHE"]) / f"ids-{'tar' if shards else 'folder'}"
    t = ItemTable("image")
    t.add_many(refs)
    table_keys(t, "content", IdIndex(store, ["bench"]))  # records identities

    def id_keys():
        t2 = ItemTable("image")
        t2.add_many(refs)
        table_keys(t2, "id", IdIndex(store))
    out["keys (id)"] = n / best_of(id_keys, repeat=repeat)

    def read():
        for s in range(0, n, batch):
            urls.read_many([r.uri for r in refs[s:s + batch]], threads=threads)
    out["read"] = n / best_of(read, repeat=repeat)
    job = EmbedJob(modality="image", rows=np.arange(n), items=tuple(refs), specs=(), fingerprints=(),
                   preprocess_cfg=PREPROCESS, batch_size=batch, decode_threads=threads)
    stage = DecodeStage(job, threads)

    def decode():
        for b in job.batches():
            assert stage(b)["ok"].all()
    out["decode"] = n / best_of(decode, repeat=max(1, repeat - 1))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--per-shard", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "hardrank-bench", "wds_read"))
    ap.add_argument("--s3", action="store_true", help="also read the shards from moto's S3 server on 127.0.0.1")
    ap.add_argument("--out", default="benchmarks/results/wds_read.json")
    a = ap.parse_args(argv)
    data = Path(a.data)
    os.environ.setdefault("HARDRANK_CACHE", str(data / "cache"))
    paths = coco_like_jpegs(data / "folder", n=a.n)
    pattern = _shards(paths, data / "shards" / str(a.per_shard), a.per_shard)
    mb = sum(os.path.getsize(p) for p in paths) / 1e6
    rows = {"folder": _measure([ImageRef(p) for p in paths], None, a.threads, a.repeat, a.batch)}
    ss = read_samples(pattern)
    rows["tar"] = _measure([ImageRef(s.image) for s in ss.samples], ss.shards, a.threads, a.repeat, a.batch)
    if a.s3:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        os.environ.update({"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1",
                           "AWS_ENDPOINT_URL": f"http://{host}:{port}"})
        fs, _ = urls.filesystem("s3://bench")
        fs.mkdir("bench")
        for s in ss.shards:
            fs.put_file(s, f"bench/shards/{Path(s).name}")
        remote = read_samples("s3://bench/shards/" + Path(pattern).name)
        rows["tar on s3 (moto)"] = _measure([ImageRef(s.image) for s in remote.samples], remote.shards, a.threads,
                                            a.repeat, a.batch)
        server.stop()
    stages = list(rows["folder"])
    print(f"{a.n} COCO-sized JPEGs ({mb / a.n * 1000:.0f} kB each), {len(ss.shards)} shards of {a.per_shard}, "
          f"{a.threads} threads; images/s (ratio to the folder)")
    print(f"{'source':<18}" + "".join(f"{s:>20}" for s in stages))
    for name, r in rows.items():
        cells = [f"{r[s]:>10.0f}" + (f" ({r[s] / rows['folder'][s]:4.2f}x)" if name != "folder" else " " * 8)
                 for s in stages]
        print(f"{name:<18}" + "".join(f"{c:>20}" for c in cells))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"n": a.n, "per_shard": a.per_shard, "threads": a.threads, "mb": round(mb, 1),
                                       "images_per_s": {k: {s: round(v, 1) for s, v in r.items()}
                                                        for k, r in rows.items()},
                                       "cpus": os.cpu_count()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
