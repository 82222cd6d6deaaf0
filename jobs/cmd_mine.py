"""`hardrank mine`: hard negatives for each query from a corpus, as resumable Parquet shards."""
from __future__ import annotations

import argparse
import sys

from hardrank import urls
from hardrank.config import DIRECTIONS, MineConfig
from hardrank.errors import EXIT_OK
from hardrank.inputs import registry
from hardrank.jobs.commands import COMMANDS
from hardrank.jobs.flags import Formatter, add_cli_flags, add_options, options_from_args
from hardrank.jobs.progress import make_progress
from hardrank.mining import mine, recall_line

__all__ = ["add_mine_parser"]


def _search_words(search: dict) -> str:
    if not search:
        return "none this run"
    if search.get("factory") is None:  # the kernels' exact top-k (a FAISS index records its factory)
        how = f"{search.get('method')} ({search.get('backend')}, {search.get('precision')})"
    else:
        how = f"FAISS {search.get('factory')}" + (" on the GPU" if search.get("gpu") else "")
        if search.get("index_folder"):
            how += f" from {search['index_folder']}"
        if search.get("nprobe") is not None:
            how += f", nprobe {search['nprobe']}"
        if search.get("refine") is not None:
            how += f", {search['refine']} candidates a result re-scored"
        if search.get("tuning_recall@10") is not None:
            how += f", tuning recall@10 {search['tuning_recall@10']:.3f} on {search.get('tuning_sample')} queries"
    if search.get("sharded"):
        how += f", {search['sharded']['shards']} Ray shards"
    return how


def _summary_lines(summary: dict, out: str) -> list[str]:
    """What a person reads of a mining summary: counts, filters, search, and where the files are (the
    rest is in ``summary.json``)."""
    c, b, dropped = summary["counts"], summary["blocks"], summary["counts"]["dropped"]
    qmod, cmod = DIRECTIONS[summary["direction"]]
    lines = [f"{c['queries']:,} {qmod} queries x {c['corpus']:,} {cmod} corpus items: {c['negatives']:,} negatives "
             f"(k {summary['k']}), {c['queries_short']:,} queries short of k",
             f"dropped: {dropped['near_duplicate']:,} near duplicates of a positive, {dropped['above_max_sim']:,} "
             f"above --max-sim, {dropped['below_min_sim']:,} below --min-sim",
             f"search: {_search_words(summary['search'])}; {b['computed']} block(s) computed, {b['skipped']} "
             f"reused; {summary['timings'].get('total', 0):.1f}s",
             f"negatives  {urls.join(out, 'negatives', 'part-*.parquet')}"]
    extra = []  # after the search line: the recall of what was written, and the memory it took
    r = summary.get("recall")
    if r:
        extra += [recall_line(r)] + ([r["shortfall"]] if r.get("shortfall") else [])
    m = summary.get("memory")
    if m and m.get("peak_anon_mb") is not None and m.get("aim_mb") is not None:
        extra.append(f"memory: peak anonymous {m['peak_anon_mb']:,.0f} MiB (aim: start-up {m['start_anon_mb']:,.0f} + "
                     f"vectors {m['vectors_mb']:,.0f} + ids {m['ids_mb']:,.0f} + budget {m['budget_mb']:,} + 10% "
                     f"(>= 64) = {m['aim_mb']:,.0f} MiB: {'met' if m['within_aim'] else 'NOT met'}); file-backed "
                     f"peak {m['peak_file_mb']:,.0f} MiB (start-up {m['start_file_mb']:,.0f}: libraries; the rest: "
                     f"mapped corpus and index pages, reclaimable)")
    elif m and m.get("peak_rss_mb") is not None:
        extra.append(f"memory: peak RSS {m['peak_rss_mb']:,.0f} MiB")
    lines[3:3] = extra
    t = summary.get("training")
    if t:
        n = f"{t['rows']:,} rows" if t["format"] == "negclip" else f"{t['lines']:,} lines"
        lines.append(f"training   {t['path']} ({n})")
    lines.append(f"summary    {urls.join(out, 'summary.json')}")
    return lines


def _cmd_mine(args) -> int:
    """Run ``hardrank mine``; prints the summary's headline. Errors reach the CLI's exit-code map."""
    cfg = options_from_args(MineConfig, args)
    echo = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    summary = mine(cfg, progress=make_progress(args.quiet), echo=echo)
    print("\n".join(_summary_lines(summary, cfg.out)))
    return EXIT_OK


def add_mine_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``mine`` sub-command to a ``hardrank`` sub-parser set."""
    p = subparsers.add_parser(
        "mine", help=COMMANDS["mine"],
        formatter_class=Formatter,
        epilog="inputs (--corpus / --queries), recognised in this order (hardrank.inputs.registry):\n"
               + registry.help_text() + "\n"
               "ids in the outputs: image paths relative to one root (--images when it holds every image, else "
               "their common folder), captions as written; query_key / negative_key columns hold content keys.\n"
               "the first two examples reuse what `hardrank demo --out results/demo` made\nexamples:\n"
               "  hardrank mine --model toy-clip --checkpoint "
               "engine/assets/toy_checkpoints/toy-clip_step0700.safetensors "
               "--queries results/demo/toy_world/karpathy_test.json --images results/demo/toy_world/images "
               "--corpus results/demo/toy_world/images/test --store results/demo/store -k 5 --out results/demo_mined "
               "--export-training results/demo_mined/negclip.tsv\n"
               "  hardrank mine --corpus results/demo_emb.parquet --queries results/demo_emb.parquet --direction t2t "
               "-k 3 --out results/demo_t2t --export-training results/demo_t2t/negatives.jsonl   # after hardrank "
               "store export\n"
               "  hardrank mine --model ViT-B-32 --pretrained openai --corpus /data/laion_subset.parquet "
               "--queries coco_karpathy_train.json --images /data/coco --direction t2i -k 20 --out mined/t2i\n"
               "  hardrank mine --model ViT-B-32 --checkpoint a.pt --corpus images/ --queries captions.json "
               "--executor ray --decoder dali --out mined/ray\n"
               "  hardrank mine --corpus /data/laion_clip_retrieval --queries captions.parquet --index /data/laion.idx "
               "--out mined/laion   # after hardrank index build --corpus /data/laion_clip_retrieval --out "
               "/data/laion.idx")
    add_options(p, MineConfig, required=("corpus", "queries", "out"))
    add_cli_flags(p, "quiet")
    p.set_defaults(func=_cmd_mine)
    return p
